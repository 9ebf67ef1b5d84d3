"""How a GPU network step's messages are cut (netstep.StagedNet mixes NetPlan in): a message above
HPCCL_NET_SLICE into equal pieces of whole 256-byte units, piece i on lane i mod L; a captured message into one
piece per lane; and whether one kernel can take a step (at most one message each way: fused within
HPCCL_NET_FUSED_SIZE, else piped with HPCCL_NET_PIPE). A function of the sizes and the lane count alone, which
every rank has alike, so sender and receiver cut alike and the engine's per-peer tags match."""
from __future__ import annotations

from typing import Any, List, Sequence

MAX_LANES = 8
PIPE_BLOCKS = 8  # pieces a piped step's kernel has in flight (a block each)
MIN_PIECE = 64 << 10  # smallest piece a message is cut into to fill its lanes (each piece is a UCX message)
_ALIGN = 256


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class NetPlan:
    """The cutting of one communicator's steps; reads the StagedNet's ``slice`` (bytes, 0: no slicing),
    ``engs`` (its lanes), ``fused_size`` and ``pipe``."""

    slice: int
    engs: List[Any]
    fused_size: int
    pipe: bool

    def fusable(self, sends: Sequence[tuple], recvs: Sequence[tuple]) -> bool:
        """Whether one exchange can run as one kernel (step_fused): not under capture (the caller checks),
        at most one message each way, each within HPCCL_NET_FUSED_SIZE (so one piece, on lane 0), a
        contiguous receive buffer (and source)."""
        lim = self.fused_size
        return (_one_each(sends, recvs) and all(self._one_piece(n, lim) for _p, _ptr, n in sends)
                and all(self._one_piece(r[1], lim) for r in recvs))

    def _one_piece(self, n: int, lim: int) -> bool:
        """n within the fused limit, and a message the other paths would send whole on lane 0 too (so a
        peer with another limit, or none, posts the same messages)."""
        return n <= lim and (not self.slice or len(self._pieces(n)) == 1)

    def pipeable(self, sends: Sequence[tuple], recvs: Sequence[tuple]) -> bool:
        """Whether one exchange can run as one piped kernel (step_piped): HPCCL_NET_PIPE on, not under
        capture (the caller checks), at most one message each way, a contiguous receive buffer (and
        source)."""
        return self.pipe and _one_each(sends, recvs)

    def _cut(self, n: int) -> List[tuple]:
        """An eager message's pieces: _pieces, or the whole message when HPCCL_NET_SLICE is 0."""
        return self._pieces(n) if self.slice else [(0, n)]

    def _pieces(self, n: int) -> List[tuple]:
        """(offset, length) of each piece of an n-byte message: ceil(n / slice) equal pieces, and with L lanes
        at least min(L, n / MIN_PIECE), so a message of a few slices still keeps every lane busy; whole
        256-byte units but the last. A function of n and the lane count alone (every rank has the same), so
        sender and receiver cut alike and the engine's per-peer tags match; 0 bytes is one piece."""
        k = -(-n // self.slice) if n > self.slice else 1
        lanes = len(self.engs)
        if lanes > 1:
            k = max(k, min(lanes, n // MIN_PIECE))
        return _split(n, k)

    def _lane_pieces(self, n: int) -> List[tuple]:
        """A captured message's pieces: one per lane, equal, each at least MIN_PIECE (a captured step is one
        template per lane, so its messages are not sliced further)."""
        return _split(n, min(len(self.engs), max(1, n // MIN_PIECE)))


def _split(n: int, k: int) -> List[tuple]:
    """(offset, length) of k equal pieces of n bytes, whole 256-byte units but the last; 0 bytes is one
    piece."""
    if k <= 1:
        return [(0, n)]
    size = _align(-(-n // k))
    return [(o, min(size, n - o)) for o in range(0, n, size)]


def _sizes(send: Optional[tuple], recv: Optional[tuple]) -> tuple:
    """(send bytes, receive bytes) of an exchange of at most one message each way."""
    return (send[2] if send is not None else 0), (recv[1] if recv is not None else 0)


def _messages(send: Optional[tuple], recv: Optional[tuple], host: int) -> List[tuple]:
    """The messages of an exchange of at most one message each way staged at ``host``, as the engine takes
    them (kind 0 send / 1 receive, peer, address, bytes): the send's staging first, the receive's after it
    (aligned)."""
    ns, nr = _sizes(send, recv)
    msgs = []
    if send is not None:
        msgs.append((0, send[0], host, ns))
    if recv is not None:
        msgs.append((1, recv[0], host + _align(ns), nr))
    return msgs


def _one_each(sends: Sequence[tuple], recvs: Sequence[tuple]) -> bool:
    """At most one message each way (and one at least), the receive into a contiguous buffer: what one
    kernel per exchange (fused or piped) takes."""
    return 0 < len(sends) + len(recvs) and len(sends) <= 1 and len(recvs) <= 1 and _flat_recvs(recvs)


def _flat_recvs(recvs: Sequence[tuple]) -> bool:
    """Every receive's buffer (and source) contiguous, so a piece of it can be written in place."""
    return all(_flat(r[2]) and (r[4] is None or _flat(r[4])) for r in recvs)


def _flat(a: Any) -> bool:
    """Whether a slice of ``a`` by elements is a view (C-contiguous), so a piece written lands in it."""
    return bool(a.flags.c_contiguous)


def _piece_of(r: tuple, o: int, ln: int) -> tuple:
    """A receive (peer, nbytes, buf, op, src) narrowed to bytes [o, o+ln) of its buffer (and source)."""
    peer, _n, buf, op, src = r
    isz = buf.dtype.itemsize
    lo, hi = o // isz, (o + ln) // isz
    return (peer, ln, buf.ravel()[lo:hi], op, None if src is None else src.ravel()[lo:hi])
