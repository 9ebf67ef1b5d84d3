"""torch.distributed on the "hpccl" backend (hpccl.torch), CPU tensors, at 2 and 3 ranks under mpiexec:
every collective torch exposes (tests/scripts/torch_backend.py checks each against local values, bad
input included) and DDP trained on hpccl equal to DDP trained on gloo in the same run (bitwise at 2
ranks, 1e-5 relative at 3)."""
from __future__ import annotations

import importlib.util

import pytest

from mpirun import results, run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (scripts/setup.sh installs the CPU build)")


@pytest.mark.parametrize("n", [2, 3])
def test_torch_backend(n):
    proc = run_mpi(n, ["-W", "ignore::FutureWarning", "tests/scripts/torch_backend.py"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == n, proc.stdout[-3000:]
    for row in rows:
        assert row["bad"] == [] and row["backend"] == "hpccl", row
        assert row["checks"] >= 27, row
