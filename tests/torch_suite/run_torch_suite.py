"""torch's own backend test suite (torch/testing/_internal/distributed/distributed_test.py) on the "hpccl"
backend, CPU, without editing torch: the backend is declared a plugin with the ddp and subgroup features
before the suite is imported (its decorators read those sets at import), registered at module top level
(every rank runs this file's top level again), and the suite's TestDistBackend is run, its ranks started
by a fork server rather than spawned (torch's harness spawns a fresh interpreter per rank per test).

    BACKEND=hpccl WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) python tests/torch_suite/run_torch_suite.py [-k EXPR]

BACKEND=gloo runs gloo through the same harness, for the side-by-side counts."""
from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "hpccl")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="hpccl-torch-suite-")
os.environ.setdefault("HPCCL_BOOTSTRAP", "store")  # the ranks have no MPI launcher
os.environ.setdefault("HPCCL_TIMEOUT", "120")

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "hpccl":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("hpccl")
    import hpccl.torch  # noqa: E402,F401 - registers the backend in every (re-)importing process

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


# ranks started by a fork server that has imported torch, its distributed test module and hpccl once, so
# each test's ranks start without importing them again (spawned, they took ~4 s per test on 2 cores)
import torch.multiprocessing  # noqa: E402

_CTX = torch.multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.testing._internal.distributed.distributed_test", "hpccl.torch"])


class TestHpcclBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # a fork server's child keeps the server's environment: hand it this test's directories
        with open(self.file_name + ".env", "w") as f:
            json.dump({k: os.environ[k] for k in ("TEMP_DIR", "INIT_METHOD")}, f)
        self._start_processes(_CTX.Process)

    def tearDown(self):
        super().tearDown()
        try:
            os.unlink(self.file_name + ".env")
        except FileNotFoundError:
            pass

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        with open(file_name + ".env") as f:
            os.environ.update(json.load(f))
        super()._run(rank, test_name, file_name, pipe, **kwargs)


if __name__ == "__main__":
    sys.exit(run_tests())
