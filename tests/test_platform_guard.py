"""The shared-memory flag protocol relies on x86-64's total store order: on any other CPU (aarch64,
monkeypatched in tests/scripts/weak_order.py) hpccl refuses it, warns, and MPI carries the node's traffic."""
from __future__ import annotations

from mpirun import results, run_mpi


def test_weak_memory_order_cpu_falls_back_to_mpi():
    proc = run_mpi(2, ["tests/scripts/weak_order.py"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == 2, proc.stdout[-3000:]
    for row in rows:
        assert row["transports"] == ["MpiTransport"] and row["ok"], row
        assert row["forced"] and "HPCCL_TRANSPORT=shm" in row["forced"] and "aarch64" in row["forced"], row
    assert "total store order" in proc.stdout  # the warning reaches the user


def test_x86_64_keeps_shared_memory():
    from hpccl.transport.shm import ordering_problem
    import platform
    assert (ordering_problem() is None) == (platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"))
