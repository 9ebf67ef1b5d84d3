"""Latency algorithms: binomial trees (log2 n steps on whole buffers) and recursive doubling."""
from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from ..runtime.primitives import Primitives


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


def _levels(parent, children):
    """Height of each rank's subtree (leaf 0) and its depth (root 0)."""
    n = len(parent)
    height, depth = [0] * n, [0] * n

    def h(r: int) -> int:
        height[r] = 1 + max((h(c) for c in children[r]), default=-1)
        return height[r]

    root = parent.index(-1)
    h(root)
    stack = [root]
    while stack:
        r = stack.pop()
        for c in children[r]:
            depth[c] = depth[r] + 1
            stack.append(c)
    return height, depth


def dbtree_all_reduce(p: Primitives, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> None:
    """Double binary tree: each half of the buffer is reduced up one tree and broadcast down it, both
    trees at once, in pipelined pieces (NCCL's large-scale latency/bandwidth compromise).

    Step schedule: a rank sends piece k up at step k + height(rank) and down at step k + depth(rank), so
    every send meets its receive in the same step on both sides and no step waits on a later one."""
    if send is not recv:
        p.copy(recv, send)
    n, r = p.size, p.rank
    if n == 1:
        return
    half = recv.size // 2
    per = max(1, _PIECE // recv.itemsize)
    plans = []
    for mirror, h in ((False, recv[:half]), (True, recv[half:])):
        parent, children = binary_tree(n, mirror)
        height, depth = _levels(parent, children)
        pieces = [h[i:i + per] for i in range(0, h.size, per)] or [h]
        plans.append((parent, children, height, depth, pieces))
    for phase in ("reduce", "bcast"):
        last = max(len(pl[4]) + max(pl[2] if phase == "reduce" else pl[3]) for pl in plans)
        for t in range(last + 1):
            sends, recvs = [], []
            for parent, children, height, depth, ps in plans:
                par, kids, P = parent[r], children[r], len(ps)
                if phase == "reduce":
                    recvs += [(c, ps[t - height[c]], op) for c in kids if 0 <= t - height[c] < P]
                    if par >= 0 and 0 <= t - height[r] < P:
                        sends.append((par, ps[t - height[r]]))
                else:
                    if par >= 0 and 0 <= t - depth[r] + 1 < P:
                        recvs.append((par, ps[t - depth[r] + 1], None))
                    if 0 <= t - depth[r] < P:
                        sends += [(c, ps[t - depth[r]]) for c in kids]
            if sends or recvs:
                p.exchange(sends, recvs)
