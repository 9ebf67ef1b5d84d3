"""GPU tests: collective over MPI ranks (run them as `mpirun -n 2 python -m pytest tests/gpu`, which
bench/gpu_suite.sh does on the GPU machine). Without CuPy or a CUDA device they skip with the reason."""
import os

import pytest


def _gpu_reason():
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"no CUDA device ({type(exc).__name__})"
    if n < 1:
        return "no CUDA device"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not importable"
    return None


REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if REASON is None:
        return
    mark = pytest.mark.skip(reason=f"GPU tests need a GPU: {REASON}")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(mark)


@pytest.fixture(scope="module")
def world():
    """A communicator over every rank with this rank's GPU current, one per test module (modules that need
    another kind define their own)."""
    import cupy
    import hpccl
    from gpu_util import have_torch
    from hpccl.gpu.device import rank_device
    comm = hpccl.Communicator()
    dev = rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(dev).use()
    if have_torch():
        import torch
        torch.cuda.set_device(dev)
    yield comm, dev
    comm.synchronize()
    comm.destroy()
