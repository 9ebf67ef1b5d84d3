"""grow and join on GPU buffers (CuPy), run under mpirun with the other GPU tests (bench/gpu_suite.sh):

- the MPI job's ranks grow over a store by one plain process (hpccl.join), every call checked on CuPy arrays on
  a stream, on the grown communicator and on the one it grew from;
- the kill-shrink-grow job of tests/test_grow.py with BUF=cupy (plain processes driven from world rank 0:
  rank 1 SIGKILLed in a loop of all_reduces, the survivors shrink it away and grow back to 4 with a fresh
  process; every process on GPU (its rank modulo the GPU count); every call checked on both communicators).

Without CuPy or a GPU the whole directory skips (tests/gpu/conftest.py says why)."""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))


def test_grow_on_gpu_buffers():
    import cupy
    import hpccl
    from dirstore import DirStore  # tests/scripts/dirstore.py
    from grow_checks import every_call
    from grow_drive import every_at, finish, plain_env, start
    from mpirun import results
    comm = hpccl.Communicator()
    ngpu = cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(comm.rank % ngpu).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    where = comm.mpi_comm.bcast(tempfile.mkdtemp(prefix="hpccl-grow-") if comm.rank == 0 else None)
    proc = None
    if comm.rank == 0:
        proc = start("grow_ranks.py", plain_env({"ROLE": "new", "JOIN_RANK": "0", "STORE_DIR": where, "KEY": "gpu",
                                                "BUF": "cupy", "DEVICE": str(comm.size % ngpu)}))
    try:
        grown = comm.grow(1, store=DirStore(where), key="gpu")

        def sync(c):
            return lambda: (stream.synchronize(), c.synchronize())
        assert grown.size == comm.size + 1 and grown.rank == comm.rank
        assert every_call(grown, cupy, sync(grown), {"stream": stream}) == every_at(grown.size)
        assert every_call(comm, cupy, sync(comm), {"stream": stream}) == every_at(comm.size)
        grown.destroy()
    finally:
        if proc is not None:
            out = finish([proc])[0]
            rows = results(out)
            assert proc.returncode == 0 and len(rows) == 1 and "error" not in rows[0], out[-3000:]
            assert rows[0]["rank"] == comm.size and rows[0]["checked"] == every_at(comm.size + 1), rows[0]
        comm.mpi_comm.Barrier()
        comm.destroy()
        if comm.rank == 0:
            shutil.rmtree(where, ignore_errors=True)


def test_kill_shrink_grow_on_gpu_buffers(tmp_path):
    import cupy
    from mpi4py import MPI
    from grow_drive import kill_shrink_grow
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        if rank == 0:  # one plain-process job, driven once
            ngpu = cupy.cuda.runtime.getDeviceCount()
            kill_shrink_grow(tmp_path, extra={"BUF": "cupy"}, per_rank=lambda r: {"DEVICE": str(r % ngpu)})
    finally:
        MPI.COMM_WORLD.Barrier()
    if rank != 0:
        pytest.skip("the plain-process job is driven from world rank 0 (its result is rank 0's)")
