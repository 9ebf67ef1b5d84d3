"""Other libraries timed on the same buffers in the same run: the MPI library (mpi4py) and torch gloo.
NCCL comes from hpccl.cli.nccl_baseline on GPU buffers. A baseline returns None when it lacks the case."""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..ops import AVG, MAX, MIN, ML_NAMES, PROD, SUM, ReduceOp, dtype_name

REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v")

Runner = Optional[Callable[[], None]]


class MpiBaseline:
    """The MPI library's own collectives through mpi4py (what `mpiexec` users would call otherwise)."""

    name = "mpi"

    def __init__(self, mpi_comm: Any) -> None:
        from mpi4py import MPI
        self.MPI, self.comm = MPI, mpi_comm
        self.ops = {SUM: MPI.SUM, PROD: MPI.PROD, MIN: MPI.MIN, MAX: MPI.MAX}

    def runner(self, coll: str, send: np.ndarray, recv: np.ndarray, op: ReduceOp, root: int,
               counts: Optional[Sequence[int]] = None) -> Runner:
        """``counts``: every rank's block of the uneven collectives (MPI_Allgatherv, MPI_Reduce_scatter)."""
        c = self.comm
        if op is AVG:  # MPI has no avg
            return None
        if dtype_name(send.dtype) in ML_NAMES:  # nor bfloat16 or float8: float8 moves as bytes, nothing reduces
            if coll in REDUCING or send.dtype.itemsize != 1:
                return None
            send, recv = send.view(np.uint8), recv.view(np.uint8)
        mop = self.ops[op]
        if coll in ("all_gather_v", "reduce_scatter_v"):
            cs = list(counts)
            if coll == "reduce_scatter_v":
                return lambda: c.Reduce_scatter(send, recv, cs, op=mop)
            spec = [recv, cs, [sum(cs[:j]) for j in range(len(cs))], self.MPI._typedict[recv.dtype.char]]
            return lambda: c.Allgatherv(send, spec)
        table = {
            "all_reduce": lambda: c.Allreduce(send, recv, op=mop),
            "all_gather": lambda: c.Allgather(send, recv),
            "reduce_scatter": lambda: c.Reduce_scatter_block(send, recv, op=mop),
            "broadcast": lambda: c.Bcast(recv, root=root),
            "reduce": lambda: c.Reduce(send, recv, op=mop, root=root),
            "all_to_all": lambda: c.Alltoall(send, recv),
            "gather": lambda: c.Gather(send, recv, root=root),
            "scatter": lambda: c.Scatter(send, recv, root=root),
        }
        return table[coll]

    def close(self) -> None:
        pass


class GlooBaseline:
    """torch.distributed with the gloo backend, rendezvous on this node (needs torch installed)."""

    name = "gloo"

    def __init__(self, mpi_comm: Any) -> None:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)  # the timed ranks already fill the cores; idle pool threads would compete
        self.torch, self.dist = torch, dist
        port = None
        if mpi_comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = mpi_comm.bcast(port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=mpi_comm.Get_rank(), world_size=mpi_comm.Get_size())
        R = dist.ReduceOp
        self.ops = {SUM: R.SUM, PROD: R.PRODUCT, MIN: R.MIN, MAX: R.MAX}

    def _t(self, a: np.ndarray):
        torch = self.torch
        if a.dtype.itemsize == 1 and dtype_name(a.dtype) in ML_NAMES:  # float8: its bytes (gloo reduces none)
            return torch.from_numpy(a.view(np.uint8))
        if a.dtype.kind == "V":
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    def runner(self, coll: str, send: np.ndarray, recv: np.ndarray, op: ReduceOp, root: int,
               counts: Optional[Sequence[int]] = None) -> Runner:
        dist = self.dist
        if op is AVG or send.dtype in (np.dtype(np.uint32), np.dtype(np.uint64)):
            return None
        if coll in REDUCING and send.dtype.itemsize == 1 and dtype_name(send.dtype) in ML_NAMES:
            return None
        s, r = self._t(send), self._t(recv)
        rop = self.ops[op]
        if coll == "all_reduce":
            def run() -> None:
                r.copy_(s)
                dist.all_reduce(r, op=rop)
            return run
        if coll == "all_gather":
            return lambda: dist.all_gather_into_tensor(r, s)
        if coll == "reduce_scatter":
            return None  # gloo has no reduce_scatter
        if coll == "broadcast":
            return lambda: dist.broadcast(r, src=root)
        if coll == "reduce":
            def run_reduce() -> None:
                r.copy_(s)
                dist.reduce(r, dst=root, op=rop)
            return run_reduce
        if coll == "all_to_all":
            return lambda: dist.all_to_all_single(r, s)
        return None

    def close(self) -> None:
        self.dist.destroy_process_group()


def make(name: str, mpi_comm: Any):
    """A baseline by name: 'mpi', 'gloo' or 'nccl' (GPU buffers only)."""
    if name == "mpi":
        return MpiBaseline(mpi_comm)
    if name == "gloo":
        return GlooBaseline(mpi_comm)
    if name == "nccl":
        from .nccl_baseline import NcclBaseline
        return NcclBaseline(mpi_comm)
    raise ValueError(f"unknown baseline {name!r}; use mpi, gloo or nccl")
