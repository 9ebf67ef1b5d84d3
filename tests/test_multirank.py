"""The multi-rank suites, each run under mpiexec at 1, 2, 3 and 4 ranks (odd counts catch ring
off-by-ones), and on emulated multi-node layouts (shared memory inside a node, the network engine between
nodes). A case may name several suite files (space-separated): one mpiexec and pytest run for all of them; a
case's id names the suites it was made for (mpi_fp8.py rides along at 2, 3 and 4 ranks and across nodes)."""
from __future__ import annotations

import pytest

from mpirun import run_pytest_mpi, shm_leftovers

SMALL = {"HPCCL_SHM_SLOT_SIZE": "4096", "HPCCL_SHM_SLOTS": "2", "HPCCL_SHM_DIRECT_SIZE": "16384"}

CASES = [
    # (ranks, suite, extra environment, id)
    *[(n, "tests/mpi/mpi_collectives.py", SMALL, f"collectives-small-buffers-{n}") for n in (1, 2, 3, 4)],
    (2, "tests/mpi/mpi_collectives.py", {}, "collectives-default-buffers-2"),
    # across emulated nodes: hier observed (issue 20) and host allocations at 2 nodes x 2, the compiled path
    # across nodes at 3 x 1; the whole collectives matrix across nodes runs between network namespaces
    # (tests/net/test_netns_ucx.py, 2 hosts x 2 and 3 hosts x 1), not a second time here
    (4, "tests/mpi/mpi_hier_observe.py tests/mpi/mpi_alloc_host.py tests/mpi/mpi_vcolls.py tests/mpi/mpi_fp8.py",
     {"HPCCL_NODE_ID": "split:2"}, "hier-observe-alloc-vcolls-2nodes-x2"),
    (3, "tests/mpi/mpi_net_hot.py tests/mpi/mpi_vcolls.py tests/mpi/mpi_fp8.py", {"HPCCL_NODE_ID": "split:1"},
     "net-hot-vcolls-3nodes-x1"),
    (2, "tests/mpi/mpi_net_hot.py tests/mpi/mpi_metrics.py", {"HPCCL_NODE_ID": "split:1"}, "net-hot-metrics-2nodes-x1"),
    (4, "tests/mpi/mpi_net_hot.py", {"HPCCL_NODE_ID": "split:1"}, "net-hot-4nodes-x1"),
    (3, "tests/mpi/mpi_collectives.py", {"HPCCL_TRANSPORT": "mpi"}, "collectives-mpi-transport-3"),
    (3, "tests/mpi/mpi_collectives.py", {"HPCCL_CHECK": "1"}, "collectives-checked-3"),  # no false alarm
    # the remaining suites with no extra environment: one mpiexec per rank count for all of them (each
    # suite file is a pytest module with its own communicator; the launch is what costs here)
    (1, "tests/mpi/mpi_errors.py tests/mpi/mpi_vcolls.py", {}, "errors-vcolls-1"),
    (2, "tests/mpi/mpi_errors.py tests/mpi/mpi_large.py tests/mpi/mpi_split.py tests/mpi/mpi_hotpath.py "
        "tests/mpi/mpi_alloc_host.py tests/mpi/mpi_frontdoor.py tests/mpi/mpi_frontdoor_tools.py tests/mpi/mpi_trace.py "
        "tests/mpi/mpi_vcolls.py tests/mpi/mpi_metrics.py tests/mpi/mpi_fp8.py", {},
     "errors-large-split-hotpath-frontdoor-trace-vcolls-metrics-2"),
    (3, "tests/mpi/mpi_errors.py tests/mpi/mpi_split.py tests/mpi/mpi_hotpath.py tests/mpi/mpi_alloc_host.py "
        "tests/mpi/mpi_frontdoor.py tests/mpi/mpi_frontdoor_tools.py tests/mpi/mpi_vcolls.py tests/mpi/mpi_fp8.py",
     {},
     "errors-split-hotpath-frontdoor-vcolls-3"),
    (4, "tests/mpi/mpi_errors.py tests/mpi/mpi_large.py tests/mpi/mpi_split.py tests/mpi/mpi_hotpath.py "
        "tests/mpi/mpi_alloc_host.py tests/mpi/mpi_trace.py tests/mpi/mpi_vcolls.py tests/mpi/mpi_fp8.py", {},
     "errors-large-split-hotpath-trace-vcolls-4"),
]


@pytest.mark.parametrize("n,suite,env", [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_suite(n, suite, env):
    # exits 0, no rank reports a failure or an error, something passed; the suite's skips (with reasons)
    # are listed in the top-level summary's "sub-suite skips" section (tests/conftest.py)
    label = f"{suite}, {n} rank{'s' if n > 1 else ''}" + "".join(f", {k}={v}" for k, v in env.items())
    run_pytest_mpi(n, suite.split(), label, env=env, timeout=900)
    assert shm_leftovers() == []
