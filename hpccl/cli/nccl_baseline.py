"""NCCL as the baseline for hpccl's GPU path: times NCCL (through cupy.cuda.nccl, unique id broadcast
over mpi4py) on buffers like hpccl's, for `hpccl-perf --compare nccl` and bench/gpu_bench.py.

    nccl_time("all_reduce", 1 << 20, "float32", iters=20, warmup=5) -> seconds per op (max over ranks)

Collective over the MPI communicator: every rank calls it with the same arguments. Sizes are bytes of
the collective as nccl-tests count them (all_gather: the gathered output; reduce_scatter: the input)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

# ncclDataType_t and ncclRedOp_t values (nccl.h)
NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
               "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3fn": 10, "float8_e5m2": 11}  # float8: 2.24+
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2,
            "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")

_state: Dict[Tuple[int, int], Any] = {}


def nccl_comm(mpi_comm: Any = None) -> Any:
    """One NcclCommunicator per (MPI communicator, device), created collectively on first use."""
    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI
    mc = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
    key = (MPI._handleof(mc) if hasattr(MPI, "_handleof") else id(mc), cupy.cuda.runtime.getDevice())
    nc = _state.get(key)
    if nc is None:
        uid = nccl.get_unique_id() if mc.Get_rank() == 0 else None
        uid = mc.bcast(uid, root=0)
        nc = nccl.NcclCommunicator(mc.Get_size(), uid, mc.Get_rank())
        _state[key] = nc
    return nc


def nccl_launch(nc: Any, coll: str, send: int, recv: int, count: int, dtype: str, stream: int,
                op: str = "sum", root: int = 0) -> None:
    """One NCCL call; count is elements per rank's send (all_gather) or receive (reduce_scatter)."""
    dt, o = NCCL_DTYPES[dtype], NCCL_OPS[op]
    if coll == "all_reduce":
        nc.allReduce(send, recv, count, dt, o, stream)
    elif coll == "all_gather":
        nc.allGather(send, recv, count, dt, stream)
    elif coll == "reduce_scatter":
        nc.reduceScatter(send, recv, count, dt, o, stream)
    elif coll == "broadcast":
        nc.broadcast(send, recv, count, dt, root, stream)
    elif coll == "reduce":
        nc.reduce(send, recv, count, dt, o, root, stream)
    else:
        raise ValueError(f"unknown collective {coll!r}; use one of {', '.join(COLLECTIVES)}")


def nccl_time(coll: str, nbytes: int, dtype: str = "float32", iters: int = 20, warmup: int = 5,
              mpi_comm: Any = None, stream: Optional[Any] = None) -> float:
    """Seconds per NCCL op of ``coll`` on ``nbytes`` (nccl-tests' size), timed with CUDA events around
    ``iters`` back-to-back calls after ``warmup``; the maximum over ranks."""
    import cupy
    from mpi4py import MPI
    mc = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
    n = mc.Get_size()
    nc = nccl_comm(mc)
    isz = ITEMSIZE[dtype]
    total = max(isz, nbytes // isz * isz)
    if coll in ("all_gather", "reduce_scatter"):
        total = max(n * isz, total // (n * isz) * n * isz)
    big = cupy.empty(total // isz * isz, dtype=cupy.uint8)
    small_n = total // n if coll in ("all_gather", "reduce_scatter") else total
    small = cupy.empty(small_n, dtype=cupy.uint8)
    if coll == "all_gather":
        send, recv, count = small, big, small_n // isz
    elif coll == "reduce_scatter":
        send, recv, count = big, small, small_n // isz
    else:
        send, recv, count = big, cupy.empty_like(big), total // isz
    s = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
    sp = s.ptr if hasattr(s, "ptr") else int(s)
    for _ in range(warmup):
        nccl_launch(nc, coll, send.data.ptr, recv.data.ptr, count, dtype, sp)
    cupy.cuda.runtime.streamSynchronize(sp)
    mc.Barrier()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    cupy.cuda.runtime.eventRecord(e0.ptr, sp)
    for _ in range(iters):
        nccl_launch(nc, coll, send.data.ptr, recv.data.ptr, count, dtype, sp)
    cupy.cuda.runtime.eventRecord(e1.ptr, sp)
    e1.synchronize()
    t = cupy.cuda.get_elapsed_time(e0, e1) / 1e3 / iters
    return mc.allreduce(t, op=MPI.MAX)


class NcclBaseline:
    """The baseline interface of hpccl.cli.baselines (runner per case) for `hpccl-perf --compare nccl`:
    NCCL on the same device buffers, launched on CuPy's current stream."""

    name = "nccl"

    def __init__(self, mpi_comm: Any) -> None:
        self.mc = mpi_comm
        self.nc = nccl_comm(mpi_comm)

    def lacks(self, coll: str) -> Optional[str]:
        """Why NCCL has no row for ``coll``, or None."""
        if coll in COLLECTIVES:
            return None
        return (f"NCCL has no {coll} call (only grouped send/recv, which is not the library's own "
                f"collective): n/a below")

    def runner(self, coll: str, send: Any, recv: Any, op: Any, root: int, counts: Any = None,
               dtype: Optional[str] = None):
        """``dtype``: the float8 type of CuPy's 1-byte words (CuPy has none); else the buffers' own."""
        if coll not in COLLECTIVES:
            return None  # see lacks()
        import cupy
        from ..memory.cuda import device_view
        s, r = device_view(send, "send"), device_view(recv, "recv")
        name = dtype or s.dtname
        if name not in NCCL_DTYPES:
            return None
        count = r.count if coll == "reduce_scatter" else s.count
        opname = getattr(op, "value", str(op))
        nc, dt = self.nc, name

        def run() -> None:
            nccl_launch(nc, coll, s.ptr, r.ptr, count, dt, cupy.cuda.get_current_stream().ptr, opname, root)
        return run

    def close(self) -> None:
        pass
