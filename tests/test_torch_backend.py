"""torch.distributed on the "hpccl" backend (hpccl.torch), CPU tensors, at 2 and 3 ranks under mpiexec and
at 2 under torchrun (store bootstrap):
every collective torch exposes (tests/scripts/torch_backend.py checks each against local values, bad
input included), and DDP (30 steps) and FSDP2 (10 steps) trained on hpccl equal to the same trained on
gloo in the same run (bitwise at 2 ranks, 1e-5 relative at 3)."""
from __future__ import annotations

import importlib.util

import pytest

from mpirun import results, run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (scripts/setup.sh installs the CPU build)")


@pytest.mark.parametrize("n,native", [(2, "1"), (3, "1"), (2, "0")], ids=["2", "3", "2-python-only"])
def test_torch_backend(n, native):
    """With the compiled backend (built by scripts/setup.sh, else on first use) torch's groups are
    ReplayGroups, every CPU call passing through it back to Python; HPCCL_TORCH_NATIVE=0 keeps the Python
    backend alone, with the same results."""
    proc = run_mpi(n, ["-W", "ignore::FutureWarning", "tests/scripts/torch_backend.py"], timeout=300,
                   env={"HPCCL_TORCH_NATIVE": native})
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == n, proc.stdout[-3000:]
    for row in rows:
        assert row["bad"] == [] and row["backend"] == "hpccl", row
        assert row["checks"] >= 29, row
        assert row["group"] == ("ReplayGroup" if native == "1" else "HpcclProcessGroup"), row


def test_native_build_failure_falls_back(tmp_path, monkeypatch):
    """A compiler that fails (or a torch whose headers do not fit) leaves the Python backend in charge,
    with a warning naming the failure: nothing else changes."""
    from hpccl.torch import launch, native
    from hpccl.torch.process_group import HpcclProcessGroup
    monkeypatch.setenv("HPCCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    monkeypatch.setattr(native, "_loaded", {})
    with pytest.raises(RuntimeError, match="failed"):
        native.build(tmp_path / "x")
    assert native.load() is None and launch._group_class() is HpcclProcessGroup
    assert not any(p.suffix == ".so" for p in tmp_path.rglob("*"))  # no half-built module left behind


def test_torch_backend_under_torchrun(tmp_path):
    """No MPI launcher: torchrun starts the ranks and hpccl bootstraps from the c10d Store torch hands it."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parent / "scripts" / "torch_backend.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PMIX", "MPI_"))}
    proc = subprocess.run([sys.executable, "-W", "ignore::FutureWarning", "-m", "torch.distributed.run",
                           "--standalone", "--nproc-per-node=2", str(script)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == 2 and all(r["bad"] == [] and r["checks"] >= 29 for r in rows), proc.stdout[-3000:]
