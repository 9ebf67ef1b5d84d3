"""Single-copy algorithms for ranks of one node: each rank exposes its user buffers and peers read them
with one kernel copy (cross-memory attach) instead of two through a shared segment. A window barrier
publishes the buffers; a last barrier keeps every owner from returning while peers still read."""
from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from ..runtime.primitives import Primitives
from .parts import offsets

_PIECE = 1 << 20  # bytes read per step before reducing, so the read data is still in cache


def _reduce_from_peers(p: Primitives, out: np.ndarray, own: np.ndarray, entry: int, offset_elems: int,
                       op: ReduceOp) -> None:
    """out = own op (every peer's exposed array ``entry`` at offset_elems .. + out.size), piece by piece."""
    n, r, isz = p.size, p.rank, out.itemsize
    per = max(1, _PIECE // isz)
    tmp = p.scratch(min(per, max(out.size, 1)), out.dtype, 3)
    for e0 in range(0, out.size, per):
        e1 = min(out.size, e0 + per)
        acc, dst = own[e0:e1], out[e0:e1]
        for q in range(n):
            if q != r:
                t = tmp[:e1 - e0]
                p.peer_read(q, entry, (offset_elems + e0) * isz, t)
                p.reduce(dst, acc, t, op)
                acc = dst
        if acc is not dst:
            p.copy(dst, acc)


def all_reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    """Each rank reduces its stripe from every peer's sendbuf into its recvbuf, then reads the other
    stripes from the peers' recvbufs."""
    n, r, isz = p.size, p.rank, send.itemsize
    so = offsets(send.size, n)
    p.expose(send, recv)
    p.barrier_window()
    _reduce_from_peers(p, recv[so[r]:so[r + 1]], send[so[r]:so[r + 1]], 0, so[r], op)
    p.barrier_window()
    for q in range(n):
        if q != r and so[q + 1] > so[q]:
            p.peer_read(q, 1, so[q] * isz, recv[so[q]:so[q + 1]])
    p.barrier_window()


def reduce_scatter(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    r, c = p.rank, recv.size
    p.expose(send)
    p.barrier_window()
    _reduce_from_peers(p, recv, send[r * c:(r + 1) * c], 0, r * c, op)
    p.barrier_window()


def reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int, op: ReduceOp) -> None:
    p.expose(send)
    p.barrier_window()
    if p.rank == root:
        _reduce_from_peers(p, recv, send, 0, 0, op)
    p.barrier_window()


def all_gather(p: Primitives, send: np.ndarray, recv: np.ndarray) -> None:
    n, r, c = p.size, p.rank, send.size
    p.expose(send)
    p.barrier_window()
    mine = recv[r * c:(r + 1) * c]
    if not np.shares_memory(mine, send):
        p.copy(mine, send)
    for q in range(1, n):
        q = (r + q) % n  # staggered: ranks do not all read rank 0 first
        p.peer_read(q, 0, 0, recv[q * c:(q + 1) * c])
    p.barrier_window()


def broadcast(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int) -> None:
    if p.rank == root:
        p.expose(send)
    p.barrier_window()
    if p.rank == root:
        if send is not recv:
            p.copy(recv, send)
    else:
        p.peer_read(root, 0, 0, recv)
    p.barrier_window()


def all_to_all(p: Primitives, send: np.ndarray, recv: np.ndarray) -> None:
    n, r = p.size, p.rank
    c = send.size // n
    isz = send.itemsize
    p.expose(send)
    p.barrier_window()
    p.copy(recv[r * c:(r + 1) * c], send[r * c:(r + 1) * c])
    for q in range(1, n):
        q = (r + q) % n
        p.peer_read(q, 0, r * c * isz, recv[q * c:(q + 1) * c])
    p.barrier_window()
