"""MPI point-to-point as a transport: the fallback between nodes until (or where) UCX is not available."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..ops import UFUNC, ReduceOp
from .base import Request, Transport

_TAG = 7001


class _MpiRequest(Request):
    __slots__ = ("peer", "req", "done", "buf", "tmp", "op", "src")

    def __init__(self, peer: int, req: Any, buf: np.ndarray, tmp: Optional[np.ndarray],
                 op: Optional[ReduceOp], src: Optional[np.ndarray] = None) -> None:
        self.peer, self.req, self.buf, self.tmp, self.op = peer, req, buf, tmp, op
        self.src = buf if src is None else src
        self.done = False

    def test(self) -> bool:
        if not self.done and self.req.Test():
            if self.op is not None:
                UFUNC[self.op](self.src, self.tmp, out=self.buf)
            self.done = True
        return self.done


class MpiTransport(Transport):
    """Sends raw bytes with Isend/Irecv on hpccl's private communicator; same-pair messages stay in order."""

    name = "mpi"

    def __init__(self, mpi_comm: Any) -> None:
        self.comm = mpi_comm

    def isend(self, peer: int, buf: np.ndarray) -> Request:
        u8 = buf.view(np.uint8)
        return _MpiRequest(peer, self.comm.Isend(u8, dest=peer, tag=_TAG), buf, None, None)

    def irecv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp],
              src: Optional[np.ndarray] = None) -> Request:
        tmp = None if op is None else np.empty_like(buf)
        target = buf if op is None else tmp
        return _MpiRequest(peer, self.comm.Irecv(target.view(np.uint8), source=peer, tag=_TAG), buf, tmp, op,
                           src)

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self.comm = None
