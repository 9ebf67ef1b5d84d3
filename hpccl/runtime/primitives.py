"""The few operations algorithms are written against: exchange (send/recv/recv-reduce), copy, reduce,
scratch memory and the mapped window. They route each peer to its transport and each buffer to its
memory kind, so one ring serves host and GPU memory and any transport."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..memory import host
from ..ops import ReduceOp
from .progress import Waiter
from ..transport.base import Request, Transport, Window

Send = Tuple[int, np.ndarray]
BLOCK_S = 0.004  # longest sleep on a progress-threaded transport before the waiter's checks run again
Recv = Tuple  # (peer, buf, op) or (peer, buf, op, src): with src, buf = src op incoming


class Primitives:
    """Per-communicator data movement; ``rank``/``size`` are communicator ranks."""

    def __init__(self, rank: int, size: int, transport_of: Dict[int, Transport],
                 window: Optional[Window], waiter: Waiter, memory=host) -> None:
        self.rank, self.size = rank, size
        self._transport_of = transport_of
        self.window = window
        self.waiter = waiter
        self.mem = memory
        self._scratch: Dict[int, np.ndarray] = {}
        self.window_views: Dict[tuple, List[np.ndarray]] = {}
        self.single_copy = False  # set by the communicator once every rank can use peer_read

    def exchange(self, sends: Sequence[Send] = (), recvs: Sequence[Recv] = (), p2p: bool = False,
                 meanwhile: Optional[Callable[[], None]] = None) -> None:
        """Run these sends and receives concurrently and return when all are complete; ``meanwhile`` runs
        once they are posted (local work that touches none of their buffers, done while they travel).

        A receive with an op reduces into its buffer: buf = buf op incoming, or src op incoming when the
        receive names a src (saves copying src into buf first). Messages to self are matched in order
        with receives from self. ``p2p``: the user's sends and receives (marked so that a receive from any
        source matches only those, never a collective's messages)."""
        pending: List[Request] = []
        self_sends = [b for p, b in sends if p == self.rank]
        for peer, buf, op, *rest in recvs:
            src = rest[0] if rest else None
            if peer == self.rank:
                incoming = self_sends.pop(0)
                if op is None:
                    self.mem.copy(buf, incoming)
                else:
                    self.mem.reduce(buf, buf if src is None else src, incoming, op)
            else:
                pending.append(self._transport_of[peer].irecv(peer, buf, op, src, p2p))
        for peer, buf in sends:
            if peer != self.rank:
                pending.append(self._transport_of[peer].isend(peer, buf, p2p))
        if meanwhile is not None:
            meanwhile()

        def ready() -> bool:
            nonlocal pending
            pending = [r for r in pending if not r.test()]  # test every request: they may depend on each other
            if pending and hasattr(pending[0], "block"):  # a transport with its own progress thread: sleep
                pending[0].block(BLOCK_S)                 # on it without the GIL, then test again
                pending = [r for r in pending if not r.test()]
            return not pending

        if not ready():
            # who is awaited is read when the timeout fires: a rendezvous send can still be pending
            # on a healthy peer at the first test
            self.waiter.wait(ready, lambda: sorted({r.peer for r in pending}))

    def send(self, peer: int, buf: np.ndarray) -> None:
        self.exchange(sends=[(peer, buf)])

    def recv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp] = None) -> None:
        self.exchange(recvs=[(peer, buf, op)])

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.mem.copy(dst, src)

    def reduce(self, dst: np.ndarray, a: np.ndarray, b: np.ndarray, op: ReduceOp) -> None:
        self.mem.reduce(dst, a, b, op)

    def scratch(self, count: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
        """Reusable temporary memory of the communicator's kind (slot selects independent buffers)."""
        nbytes = count * dtype.itemsize
        cur = self._scratch.get(slot)
        if cur is None or cur.size < nbytes:
            cur = self.mem.empty(max(nbytes, 64), np.dtype(np.uint8))
            self._scratch[slot] = cur
        return cur[:nbytes].view(dtype)

    def barrier_window(self) -> None:
        self.window.barrier(self.waiter.wait)

    def expose(self, *arrays: np.ndarray) -> None:
        """Publish these arrays for single-copy reads by peers (then a window barrier makes it visible)."""
        self.window.expose(arrays)

    def peer_read(self, rank: int, entry: int, offset: int, dst: np.ndarray) -> None:
        """dst = bytes from ``offset`` of the array ``rank`` exposed as ``entry`` (one kernel copy)."""
        self.window.peer_read(rank, entry, offset, dst)
