"""torch's own backend test suite (torch/testing/_internal/distributed/distributed_test.py) on the "hpccl"
backend, CPU, without editing torch: the backend is declared a plugin with the ddp and subgroup features
before the suite is imported (its decorators read those sets at import), registered at module top level
(spawned ranks re-import this file), and the suite's TestDistBackend is run.

    BACKEND=hpccl WORLD_SIZE=2 TEMP_DIR=$(mktemp -d) python tests/torch_suite/run_torch_suite.py [-k EXPR]

BACKEND=gloo runs gloo through the same harness, for the side-by-side counts."""
from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "hpccl")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="hpccl-torch-suite-")
os.environ.setdefault("HPCCL_BOOTSTRAP", "store")  # spawned ranks: no MPI launcher
os.environ.setdefault("HPCCL_TIMEOUT", "120")

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "hpccl":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("hpccl")
    import hpccl.torch  # noqa: E402,F401 - registers the backend in every (re-)importing process

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestHpcclBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())
