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
