"""Direct algorithms over a mapped window (shared memory, GPU peer memory): each rank stages its data in
its own window, one barrier publishes it, then ranks read each other's windows directly.

Windows are used in two alternating halves, so chunk i+2 reuses a half only after the barrier of chunk
i+1, which every rank passes after finishing chunk i: one barrier per chunk is enough for one-pass
algorithms, two for those that publish a result (twoshot)."""
from __future__ import annotations

from typing import Iterable, Iterator, List, Tuple

import numpy as np

from ..ops import ReduceOp
from ..runtime.primitives import Primitives
from .parts import offsets


def _chunks(p: Primitives, count: int, itemsize: int, blocks: int = 1) -> Iterable[Tuple[int, int, int]]:
    """(first element, elements, byte offset of the half) for each chunk that fits a half window; a
    tuple when one chunk does (the small-message path, where a generator's cost shows)."""
    w = p.window
    half = (w.size // 2) // 64 * 64
    per = max(1, half // (itemsize * blocks))
    if count <= per:
        base = w.phase * half
        w.phase ^= 1
        return ((0, count, base),)
    return _chunk_iter(w, half, per, count)


def _chunk_iter(w, half: int, per: int, count: int) -> Iterator[Tuple[int, int, int]]:
    for c0 in range(0, count, per):
        base = w.phase * half
        w.phase ^= 1
        yield c0, min(per, count - c0), base


def _views(p: Primitives, base: int, e: int, dtype: np.dtype) -> List[np.ndarray]:
    """Every rank's window as ``e`` elements of dtype from byte ``base`` (cached: hot for small calls)."""
    key = (base, e, dtype)
    cache = p.window_views
    hit = cache.get(key)
    if hit is None:
        if len(cache) > 512:
            cache.clear()
        nb = e * dtype.itemsize
        hit = cache[key] = [p.window.buffer(q)[base:base + nb].view(dtype) for q in range(p.size)]
    return hit


def _reduce_all(p: Primitives, out: np.ndarray, views: List[np.ndarray], op: ReduceOp) -> None:
    """out = views[0] op views[1] op ... in rank order, so every rank computes identical bits."""
    if len(views) == 1:
        p.copy(out, views[0])
        return
    p.reduce(out, views[0], views[1], op)
    for v in views[2:]:
        p.reduce(out, out, v, op)


def all_reduce_oneshot(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    chunks = _chunks(p, send.size, send.itemsize)
    if type(chunks) is tuple:  # one chunk: the latency path, no slicing of the user's buffers
        views = _views(p, chunks[0][2], send.size, send.dtype)
        p.copy(views[p.rank], send)
        p.barrier_window()
        _reduce_all(p, recv, views, op)
        return
    for c0, e, base in chunks:
        views = _views(p, base, e, send.dtype)
        p.copy(views[p.rank], send[c0:c0 + e])
        p.barrier_window()
        _reduce_all(p, recv[c0:c0 + e], views, op)


def all_reduce_twoshot(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    """Stage all but this rank's own stripe (which it reduces straight from sendbuf), reduce the own
    stripe across every window, publish it, then copy every stripe out."""
    n, r = p.size, p.rank
    for c0, e, base in _chunks(p, send.size, send.itemsize):
        views = _views(p, base, e, send.dtype)
        so = offsets(e, n)
        a, b = so[r], so[r + 1]
        chunk = send[c0:c0 + e]
        if a:
            p.copy(views[r][:a], chunk[:a])
        if b < e:
            p.copy(views[r][b:], chunk[b:])
        p.barrier_window()
        mine, acc = views[r][a:b], chunk[a:b]
        for q in range(n):
            if q != r:
                p.reduce(mine, acc, views[q][a:b], op)
                acc = mine
        if acc is not mine:
            p.copy(mine, acc)
        p.barrier_window()
        out = recv[c0:c0 + e]
        for q in range(n):
            p.copy(out[so[q]:so[q + 1]], views[q][so[q]:so[q + 1]])


def all_gather(p: Primitives, send: np.ndarray, recv: np.ndarray) -> None:
    n, r, c = p.size, p.rank, send.size
    in_place = np.shares_memory(send, recv)
    for c0, e, base in _chunks(p, c, send.itemsize):
        views = _views(p, base, e, send.dtype)
        p.copy(views[r], send[c0:c0 + e])
        p.barrier_window()
        for q in range(n):
            if not (in_place and q == r):
                p.copy(recv[q * c + c0:q * c + c0 + e], views[q])


def reduce_scatter(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    n, r, c = p.size, p.rank, recv.size
    blocks = send.reshape(n, c)
    for c0, e, base in _chunks(p, c, send.itemsize, blocks=n):
        views = [v.reshape(n, e) for v in _views(p, base, n * e, send.dtype)]
        p.copy(views[r], blocks[:, c0:c0 + e])
        p.barrier_window()
        _reduce_all(p, recv[c0:c0 + e], [v[r] for v in views], op)


def broadcast(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int) -> None:
    r = p.rank
    for c0, e, base in _chunks(p, recv.size, recv.itemsize):
        views = _views(p, base, e, recv.dtype)
        if r == root:
            p.copy(views[r], send[c0:c0 + e])
        p.barrier_window()
        if r == root:
            if send is not recv:
                p.copy(recv[c0:c0 + e], send[c0:c0 + e])
        else:
            p.copy(recv[c0:c0 + e], views[root])


def reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int, op: ReduceOp) -> None:
    for c0, e, base in _chunks(p, send.size, send.itemsize):
        views = _views(p, base, e, send.dtype)
        p.copy(views[p.rank], send[c0:c0 + e])
        p.barrier_window()
        if p.rank == root:
            _reduce_all(p, recv[c0:c0 + e], views, op)


def all_to_all(p: Primitives, send: np.ndarray, recv: np.ndarray) -> None:
    n, r = p.size, p.rank
    c = send.size // n
    sblocks, rblocks = send.reshape(n, c), recv.reshape(n, c)
    for c0, e, base in _chunks(p, c, send.itemsize, blocks=n):
        views = [v.reshape(n, e) for v in _views(p, base, n * e, send.dtype)]
        p.copy(views[r], sblocks[:, c0:c0 + e])
        p.barrier_window()
        for q in range(n):
            p.copy(rblocks[q, c0:c0 + e], views[q][r])
