"""Latency algorithms: binomial trees (log2 n steps on whole buffers) and recursive doubling."""
from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from ..primitives import Primitives


def reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int, op: ReduceOp) -> None:
    """Binomial reduce: in round k, ranks with bit k set (relative to root) send their partial and stop."""
    n, r = p.size, p.rank
    v = (r - root) % n
    acc = recv if r == root else p.scratch(send.size, send.dtype, 2)
    if acc is not send:
        p.copy(acc, send)
    mask = 1
    while mask < n:
        if v & mask:
            p.send((v - mask + root) % n, acc)
            return
        if v + mask < n:
            p.recv((v + mask + root) % n, acc, op)
        mask <<= 1


def broadcast(p: Primitives, send: np.ndarray, recv: np.ndarray, root: int) -> None:
    """Binomial broadcast: receive once from the parent, then send to children, largest subtree first."""
    n, r = p.size, p.rank
    if r == root and send is not recv:
        p.copy(recv, send)
    v = (r - root) % n
    mask = 1
    while mask < n:
        if v & mask:
            p.recv((v - mask + root) % n, recv)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < n:
            p.send((v + mask + root) % n, recv)
        mask >>= 1


def all_reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    reduce(p, send, recv, 0, op)
    broadcast(p, recv, recv, 0)


def rd_all_reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    """Recursive doubling; ranks beyond the largest power of two fold into a partner first and back last.
    Every pairwise combine is commutative, so all ranks end with bitwise-identical results."""
    if send is not recv:
        p.copy(recv, send)
    n, r = p.size, p.rank
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    if r >= pof2:
        p.send(r - pof2, recv)
        p.recv(r - pof2, recv)
        return
    if r < rem:
        p.recv(r + pof2, recv, op)
    tmp = p.scratch(recv.size, recv.dtype, 0)
    mask = 1
    while mask < pof2:
        partner = r ^ mask
        p.exchange([(partner, recv)], [(partner, tmp, None)])
        p.reduce(recv, recv, tmp, op)
        mask <<= 1
    if r < rem:
        p.send(r + pof2, recv)


_PIECE = 256 << 10  # bytes per pipelined piece of a double binary tree


def binary_tree(n: int, mirror: bool):
    """parent/children of a balanced in-order binary tree over positions 0..n-1; the second tree of a
    double binary tree maps position p to rank n-1-p (mirror) so most ranks are interior in only one."""
    parent = [-1] * n
    children = [[] for _ in range(n)]

    def rank(pos: int) -> int:
        return n - 1 - pos if mirror else pos

    def build(lo: int, hi: int, par: int) -> None:
        if lo >= hi:
            return
        mid = (lo + hi) // 2
        r = rank(mid)
        if par >= 0:
            parent[r] = par
            children[par].append(r)
        build(lo, mid, r)
        build(mid + 1, hi, r)

    build(0, n, -1)
    return parent, children


def dbtree_all_reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    """Double binary tree: each half of the buffer is reduced up one tree and broadcast down it, both
    trees at once, in pipelined pieces (NCCL's large-scale latency/bandwidth compromise)."""
    if send is not recv:
        p.copy(recv, send)
    n, r = p.size, p.rank
    if n == 1:
        return
    half = recv.size // 2
    halves = [recv[:half], recv[half:]]
    trees = [binary_tree(n, False), binary_tree(n, True)]
    per = max(1, _PIECE // recv.itemsize)
    pieces = [[h[i:i + per] for i in range(0, h.size, per)] or [h] for h in halves]
    steps = max(len(ps) for ps in pieces) + 1
    for phase in ("reduce", "bcast"):
        for t in range(steps):
            sends, recvs = [], []
            for (parent, children), ps in zip(trees, pieces):
                kids, par = children[r], parent[r]
                if phase == "reduce":
                    if t < len(ps):
                        recvs += [(c, ps[t], op) for c in kids]
                    if par >= 0 and 1 <= t <= len(ps):
                        sends.append((par, ps[t - 1]))
                else:
                    if par >= 0 and t < len(ps):
                        recvs.append((par, ps[t], None))
                    if 1 <= t <= len(ps):
                        sends += [(c, ps[t - 1]) for c in kids]
            p.exchange(sends, recvs)
