"""MPI point-to-point as a transport: between nodes where hpccl's native engine cannot load (or HPCCL_NET=mpi),
and between a node's ranks with HPCCL_TRANSPORT=mpi. Device buffers (the GPU network path over MPI, run by the
proxy thread, hpccl/gpu/proxy.py) are staged through host memory, since a
CUDA-aware MPI cannot be assumed; what arrives is combined on the GPU."""
from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np

from .. import memory
from ..ops import ReduceOp
from .base import Request, Transport
from .control import ControlChannel

_TAG = 7001
_P2P_TAG = 7003  # point-to-point messages: what a receive from any source may match
_CTRL = 7002  # control messages on hpccl's private communicator (control.py)


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
                memory.reduce(self.buf, self.src, self.tmp, self.op)
            elif self.tmp is not None:  # a staged device receive
                memory.copy(self.buf, self.tmp)
            self.done = True
        return self.done


class _StagedRecv(_MpiRequest):
    """A receive into host memory for a device buffer: copied (or uploaded and reduced) on completion."""

    __slots__ = ("host",)

    def __init__(self, peer, req, buf, host, op, src) -> None:
        super().__init__(peer, req, buf, None, op, src)
        self.host = host

    def test(self) -> bool:
        if not self.done and self.req.Test():
            incoming = self.host.view(self.buf.dtype)
            if self.op is None:
                memory.copy(self.buf, incoming)
            else:
                memory.reduce(self.buf, self.src, _device_tmp(self.buf, incoming), self.op)
            self.done = True
        return self.done


def _staged(buf):
    """A host copy of a device buffer (cupy), or buf itself when it is host memory."""
    if isinstance(buf, np.ndarray):
        return buf
    import cupy
    return cupy.asnumpy(buf)


def _device_tmp(buf, host):
    """Where a staged receive that reduces lands on the GPU before combining."""
    import cupy
    with cupy.cuda.Device(buf.device.id):
        out = cupy.asarray(host)
    cupy.cuda.get_current_stream().synchronize()
    return out


class MpiTransport(ControlChannel, Transport):
    """Sends raw bytes with Isend/Irecv on hpccl's private communicator; same-pair messages stay in order."""

    name = "mpi"

    def __init__(self, mpi_comm: Any) -> None:
        self.comm = mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        self._control_init()

    # ----- control channel (control.ControlChannel): a tag of its own on the private communicator ------
    def _ctrl_live(self) -> bool:
        return self.comm is not None

    def _ctrl_send(self, peer: int, msg: np.ndarray) -> Any:
        return self.comm.Isend(msg, dest=peer, tag=_CTRL)

    @staticmethod
    def _ctrl_done(req: Any) -> bool:
        return req.Test()

    def _ctrl_arrived(self) -> Iterator[Optional[np.ndarray]]:
        from mpi4py import MPI
        st = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_CTRL, status=st):
            msg = np.empty(3, dtype=np.int64)
            self.comm.Recv(msg, source=st.Get_source(), tag=_CTRL)
            yield msg

    def isend(self, peer: int, buf: np.ndarray, p2p: bool = False) -> Request:
        host = _staged(buf)
        tag = _P2P_TAG if p2p else _TAG
        return _MpiRequest(peer, self.comm.Isend(host.view(np.uint8), dest=peer, tag=tag), host, None, None)

    def irecv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp],
              src: Optional[np.ndarray] = None, p2p: bool = False) -> Request:
        tag = _P2P_TAG if p2p else _TAG
        if isinstance(buf, np.ndarray):
            tmp = None if op is None else np.empty_like(buf)
            target = buf if op is None else tmp
            return _MpiRequest(peer, self.comm.Irecv(target.view(np.uint8), source=peer, tag=tag), buf, tmp,
                               op, src)
        host = np.empty(buf.nbytes, dtype=np.uint8)
        req = _StagedRecv(peer, self.comm.Irecv(host, source=peer, tag=tag), buf, host, op, src)
        return req

    def probe(self, peer: int) -> bool:
        return bool(self.comm.Iprobe(source=peer, tag=_P2P_TAG))

    def close(self) -> None:
        if self.comm is not None:
            try:
                self._poll()  # answer what is pending; small eager sends complete locally
            except Exception:  # noqa: BLE001 - closing must not fail on a broken job
                pass
        self._ctrl_sends = []
        self.comm = None
