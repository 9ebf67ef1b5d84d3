"""Ring algorithms: bandwidth-optimal, n-1 (or 2(n-1)) neighbour steps, each pipelined by the transport."""
from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from ..runtime.primitives import Primitives
from .parts import offsets

_PIECE = 1 << 20  # bytes per pipelined broadcast piece


def all_reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    """Out of place costs no extra pass: each chunk's first reduction reads sendbuf and writes recvbuf."""
    n, r = p.size, p.rank
    if n == 1:
        if send is not recv:
            p.copy(recv, send)
        return
    off = offsets(recv.size, n)
    right, left = (r + 1) % n, (r - 1) % n

    def chunk(buf: np.ndarray, i: int) -> np.ndarray:
        i %= n
        return buf[off[i]:off[i + 1]]

    for s in range(n - 1):  # reduce-scatter: rank r ends owning chunk r+1
        out = chunk(send, r) if s == 0 else chunk(recv, r - s)
        c = r - s - 1
        p.exchange([(right, out)], [(left, chunk(recv, c), op, chunk(send, c))])
    for s in range(n - 1):  # all-gather
        p.exchange([(right, chunk(recv, r + 1 - s))], [(left, chunk(recv, r - s), None)])


def all_gather(p: Primitives, send: np.ndarray, recv: np.ndarray) -> None:
    """The first step sends from ``send`` itself, so this rank's own block is copied into place while that
    step's messages are on the wire (no step reads it)."""
    n, r, c = p.size, p.rank, send.size
    mine = recv[r * c:(r + 1) * c]
    own = None if p.mem.shares(mine, send) else (lambda: p.copy(mine, send))  # by address (capture-safe)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        si, ri = (r - s) % n, (r - s - 1) % n
        out = send if s == 0 else recv[si * c:(si + 1) * c]
        p.exchange([(right, out)], [(left, recv[ri * c:(ri + 1) * c], None)], meanwhile=own if s == 0 else None)
    if n == 1 and own is not None:
        own()


def reduce_scatter(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    n, r, c = p.size, p.rank, recv.size
    if n == 1:
        p.copy(recv, send[:c])
        return
    right, left = (r + 1) % n, (r - 1) % n
    blk = lambda i: send[(i % n) * c:((i % n) + 1) * c]  # noqa: E731
    bufs = [p.scratch(c, send.dtype, 0), p.scratch(c, send.dtype, 1)]
    outgoing = blk(r - 1)
    for s in range(n - 1):
        target_chunk = r - s - 2
        acc = recv if s == n - 2 else bufs[s % 2]
        p.exchange([(right, outgoing)], [(left, acc, op, blk(target_chunk))])
        outgoing = acc


def broadcast(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int) -> None:
    """Pipelined chain root -> root+1 -> ...: each rank forwards piece k while receiving piece k+1."""
    n, r = p.size, p.rank
    if r == root and send is not recv:
        p.copy(recv, send)
    if n == 1:
        return
    v = (r - root) % n
    nxt, prv = (r + 1) % n, (r - 1) % n
    per = max(1, _PIECE // recv.itemsize)
    pieces = [recv[i:i + per] for i in range(0, recv.size, per)] or [recv]
    for k in range(len(pieces) + 1):
        sends = [(nxt, pieces[k - 1])] if 0 < k and v < n - 1 else []
        recvs = [(prv, pieces[k], None)] if k < len(pieces) and v > 0 else []
        if v == 0 and k < len(pieces):
            sends = [(nxt, pieces[k])]
            recvs = []
        elif v == 0:
            break
        p.exchange(sends, recvs)
