"""MPI point-to-point as a transport: the fallback between nodes until (or where) UCX is not available.
Device buffers (the GPU network path, run by the proxy thread) are staged through host memory, since a
CUDA-aware MPI cannot be assumed; what arrives is combined on the GPU."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import memory
from ..ops import ReduceOp
from .base import Request, Transport

_TAG = 7001
_CTRL = 7002  # control messages on hpccl's private communicator: int64 [kind, rank, seq]
_ABORT, _QUERY, _ANSWER = 1, 2, 3


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


class MpiTransport(Transport):
    """Sends raw bytes with Isend/Irecv on hpccl's private communicator; same-pair messages stay in order."""

    name = "mpi"

    def __init__(self, mpi_comm: Any) -> None:
        self.comm = mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        self._seq = 0
        self._aborted_by: Optional[int] = None
        self._seen: dict = {}  # peer -> the sequence number it answered with in the last survey
        self._sends: list = []  # control sends in flight (their buffers live until they complete)

    # ----- control channel: abort, and "which collective are you in?" at a timeout --------------------
    def _post(self, peer: int, kind: int, who: Optional[int] = None) -> None:
        msg = np.array([kind, self.rank if who is None else who, self._seq], dtype=np.int64)
        self._sends.append((self.comm.Isend(msg, dest=peer, tag=_CTRL), msg))

    def _poll(self) -> None:
        """Handle every control message that has arrived: record aborts and answers, answer queries."""
        from mpi4py import MPI
        st = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_CTRL, status=st):
            msg = np.empty(3, dtype=np.int64)
            self.comm.Recv(msg, source=st.Get_source(), tag=_CTRL)
            kind, peer, seq = (int(v) for v in msg)
            if kind == _ABORT and self._aborted_by is None:
                self._aborted_by = peer
            elif kind == _QUERY:
                self._post(peer, _ANSWER)
            elif kind == _ANSWER:
                self._seen[peer] = seq
        self._sends = [(r, m) for r, m in self._sends if not r.Test()]

    def announce(self, seq: int) -> None:
        self._seq = seq

    def peer_aborted(self) -> Optional[int]:
        if self.comm is not None:
            self._poll()
        return self._aborted_by

    def arrived(self, peer: int) -> Optional[int]:
        return self._seen.get(peer)

    def survey(self, peers: Any, seconds: float) -> None:
        """Ask these peers which collective they are in (ranks blocked in an hpccl wait answer while they
        poll); arrived() then reports their answers. A peer that does not answer within ``seconds`` (stopped,
        dead, or busy outside hpccl) stays unknown, which the waiter counts as not arrived."""
        if self.comm is None:
            return
        import time
        self._seen = {}
        peers = [p for p in peers if p != self.rank]
        for p in peers:
            self._post(p, _QUERY)
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(p not in self._seen for p in peers):
            self._poll()
            time.sleep(1e-3)

    def isend(self, peer: int, buf: np.ndarray) -> Request:
        host = _staged(buf)
        return _MpiRequest(peer, self.comm.Isend(host.view(np.uint8), dest=peer, tag=_TAG), host, None, None)

    def irecv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp],
              src: Optional[np.ndarray] = None) -> Request:
        if isinstance(buf, np.ndarray):
            tmp = None if op is None else np.empty_like(buf)
            target = buf if op is None else tmp
            return _MpiRequest(peer, self.comm.Irecv(target.view(np.uint8), source=peer, tag=_TAG), buf, tmp,
                               op, src)
        host = np.empty(buf.nbytes, dtype=np.uint8)
        req = _StagedRecv(peer, self.comm.Irecv(host, source=peer, tag=_TAG), buf, host, op, src)
        return req

    def abort(self, origin: int) -> None:
        """Tell every peer rank ``origin`` failed: their waits poll the control channel and fail at once."""
        if self.comm is None:
            return
        for p in range(self.size):
            if p != self.rank:
                self._post(p, _ABORT, origin)

    def close(self) -> None:
        if self.comm is not None:
            try:
                self._poll()  # answer what is pending; small eager sends complete locally
            except Exception:  # noqa: BLE001 - closing must not fail on a broken job
                pass
        self._sends = []
        self.comm = None
