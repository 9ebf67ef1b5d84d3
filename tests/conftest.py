"""Top-level test hooks: the skips inside sub-suites (pytest files run under mpiexec, torch's backend suite)
are listed in a "sub-suite skips" section of the run's summary, with their reasons, so a sub-suite that is
green only because its tests skipped is seen; and what each test left in /dev/shm is looked at after it: MPI's
own segments (a rank that ended without MPI_Finalize leaves them) are removed once no other live process uses
them (another test run's running job keeps its own) and the tests that left them named in a "/dev/shm"
section (hpccl's own segments are asserted by the tests that make them)."""
from __future__ import annotations

import os
import time

import pytest

import mpirun

#: the quick tier (`bash scripts/test.sh --quick`, or `pytest -m quick`): every subsystem once, in under
#: 5 minutes on a 2-core machine. Node ids, or prefixes of them (a whole file, a parametrised case).
QUICK = (
    # front end, planner, configuration, errors
    "tests/test_units.py", "tests/test_frontend_units.py", "tests/test_planner.py",
    "tests/test_platform_guard.py", "tests/test_imports.py",
    # the node's host path: shared memory and the compiled hot path, under mpiexec
    "tests/test_multirank.py::test_suite[collectives-default-buffers-2]",
    "tests/test_multirank.py::test_suite[errors-large-split-hotpath-frontdoor-trace-vcolls-metrics-2]",
    # the network: the engine, its compiled path across nodes, replays and lanes, the fallback to MPI
    "tests/net/test_engine_units.py", "tests/net/test_net_replay.py", "tests/net/test_engine_lanes.py",
    "tests/net/test_engine_fallback.py",  # no engine: MPI with one warning, hpccl-info's network path
    "tests/test_multirank.py::test_suite[net-hot-metrics-2nodes-x1]",
    # the GPU side, as far as a machine without a GPU can check it
    "tests/test_netstep_slices.py", "tests/test_gpu_sync.py", "tests/test_cuda_sources.py::test_ctypes_mirror",
    # failures, observability, the command-line tools
    "tests/test_failure_units.py", "tests/test_control_units.py",
    "tests/test_failures.py::test_skipped_collective_times_out_naming_the_missing_rank[2-]",
    "tests/test_log.py", "tests/test_plain_text.py", "tests/test_trace.py::test_nvtx",
    "tests/test_cli.py::test_info", "tests/test_cli.py::test_perf_rejects",
    # torch.distributed
    "tests/test_torch_backend.py::test_torch_backend[2]",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the quick tier (tests/conftest.py QUICK; scripts/test.sh --quick)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(QUICK):
            item.add_marker(pytest.mark.quick)


_SHM_LEFT: list = []  # (test node id, the MPI segments it left in /dev/shm, removed)
_SHM_BUSY: dict = {}  # segment -> the test that left it while another process still used it (removed later)


def _remove_busy(wait: float = 0.0) -> None:
    """Remove the segments left in use by earlier tests once nothing uses them (waiting up to ``wait`` s)."""
    end = time.monotonic() + wait
    while _SHM_BUSY:
        for name in mpirun.remove_unused(list(_SHM_BUSY)):
            _SHM_LEFT.append((_SHM_BUSY.pop(name), [name]))
        for name in [n for n in _SHM_BUSY if not os.path.exists(os.path.join("/dev/shm", n))]:
            del _SHM_BUSY[name]  # its holder removed it
        if not _SHM_BUSY or time.monotonic() >= end:
            break
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def _dev_shm_after_each_test(request):
    before = mpirun.shm_snapshot()
    yield
    busy: set = set()
    left = mpirun.remove_mpi_leftovers(before, busy)
    if left:
        _SHM_LEFT.append((request.node.nodeid, sorted(left)))
    _SHM_BUSY.update((name, request.node.nodeid) for name in busy)
    _remove_busy()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    # what the test recorded (mpirun.record_sub_suite) goes on its reports as a user property
    # (serialised with the report, so it also reaches the summary from xdist workers and junit XML)
    while mpirun._pending:
        item.user_properties.append((mpirun.SUB_SUITE_PROPERTY, mpirun._pending.pop(0)))


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    _remove_busy(wait=10.0)
    if _SHM_BUSY:
        tr.write_sep("=", f"/dev/shm: {len(_SHM_BUSY)} MPI segment(s) left in use by another live process")
        for name, nodeid in sorted(_SHM_BUSY.items()):
            tr.write_line(f"{nodeid}: {name}")
    if _SHM_LEFT:
        tr.write_sep("=", f"/dev/shm: MPI segments left by {len(_SHM_LEFT)} test(s), removed")
        for nodeid, names in _SHM_LEFT:
            tr.write_line(f"{nodeid}: {', '.join(names)}")
    _sub_suite_skips(tr)


def _sub_suite_skips(terminalreporter):
    found = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", None) or ():
                if name == mpirun.SUB_SUITE_PROPERTY:
                    found[(rep.nodeid, value["suite"])] = value
    if not found:
        return
    with_skips = {k: v for k, v in found.items() if v["skipped"]}
    tr = terminalreporter
    total = sum(v["skipped"] for v in with_skips.values())
    tr.write_sep("=", f"sub-suite skips: {total} in {len(with_skips)} of {len(found)} sub-suites" if total
                 else f"sub-suite skips: none in {len(found)} sub-suite{'s' if len(found) > 1 else ''}")
    for (nodeid, suite), v in sorted(with_skips.items()):
        tr.write_line(f"{nodeid} [{suite}]: {v['passed']} passed, {v['skipped']} skipped")
        for n, where, reason in v["skips"]:
            tr.write_line(f"  SKIPPED [{n}] {where + ': ' if where else ''}{reason}")
