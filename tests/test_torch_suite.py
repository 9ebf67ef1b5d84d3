"""A selection of torch's own backend test suite on "hpccl" (2 ranks, CPU), run through
tests/torch_suite/run_torch_suite.py; the whole suite's log, beside gloo's, is docs/perf/torch_suite/."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from mpirun import record_sub_suite

ROOT = Path(__file__).resolve().parent.parent
# collectives, subgroups, DDP; each test starts 2 ranks from the harness's fork server (under 1 s here)
SELECTION = [  # tests of the suite that run on CPU for this backend (the full run's log lists them)
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_product", "test_all_reduce_sum_async",
    "test_all_reduce_full_group_sum", "test_all_gather", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_broadcast", "test_reduce_sum", "test_gather", "test_scatter",
    "test_barrier", "test_send_recv", "test_send_recv_with_tag", "test_isend", "test_irecv",
    "test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_any_source_torch_profiler",
    "test_DistributedDataParallelCPU", "test_ddp_logging_data_cpu", "test_static_graph_api_cpu",
    "test_destroy_group",
]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("expecttest") is None,
                    reason="torch (and its test helpers expecttest, hypothesis) are not installed")
def test_torch_suite_selection(tmp_path):
    env = dict(os.environ, BACKEND="hpccl", WORLD_SIZE="2", TEMP_DIR=str(tmp_path),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    # no MPI launcher variables (the store bootstrap), and not CI: torch's run_tests would then write XML
    # reports through a module (xmlrunner) this project does not install
    env = {k: v for k, v in env.items() if not k.startswith(("PMI", "OMPI_", "PMIX", "MPI_")) and k != "CI"}
    args = [sys.executable, str(ROOT / "tests" / "torch_suite" / "run_torch_suite.py"), "-v"]
    args += [f"TestHpcclBackend.{name}" for name in SELECTION]  # exact test ids
    proc = subprocess.run(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    tail = proc.stdout[-5000:]
    ran = re.search(r"Ran (\d+) tests?", proc.stdout)
    assert proc.returncode == 0 and ran, tail
    skipped = re.search(r"skipped=(\d+)", proc.stdout)
    n_run, n_skip = int(ran.group(1)), int(skipped.group(1)) if skipped else 0
    reasons = Counter(re.findall(r"skipped '([^']*)'", proc.stdout))
    # the sub-suite's skips, with their reasons, in the top-level summary ("sub-suite skips", tests/conftest.py)
    record_sub_suite("torch backend suite selection, 2 ranks", n_run, n_skip,
                     [(k, "", reason) for reason, k in sorted(reasons.items())])
    assert n_run - n_skip >= len(SELECTION), tail  # the selected tests really ran, not skipped into green
