"""Schedules of gather, scatter, all_gather_v and reduce_scatter_v over the primitives (host memory, and device
memory on the network proxy): blocks of any size, zero included, given as [(offset, count)] per rank.

direct: every block goes straight from the rank that has it to the rank that needs it (for all_gather_v this
is a broadcast of each rank's block to all, run as one group); tree: binomial gather/scatter, log2 n steps
of whole subtrees (few messages at the root: the small-block choice); ring: n-1 neighbour steps, each block
passed on (all_gather_v) or reduced on its way to its owner (reduce_scatter_v): bandwidth-optimal."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from ..ops import ReduceOp
from ..runtime.primitives import Primitives

Blocks = Sequence[Tuple[int, int]]  # (offset, count) per rank
_TREE_SLOT, _RED_SLOT = 3, 2  # scratch slots (ring.py and tree.py use 0-2 for their own calls)


def _subtree(v: int, n: int) -> int:
    """Relative ranks v .. v+span-1 form v's binomial subtree (rooted at relative rank 0)."""
    return min(n, v + (v & -v)) - v if v else n


def _runs(blocks: Blocks, root: int, n: int, v0: int, span: int) -> List[Tuple[int, int, int]]:
    """Relative ranks v0 .. v0+span-1 as contiguous (offset in the user's buffer, offset in subtree order,
    count) pieces: one piece where their blocks follow each other, as a packed buffer's do."""
    out: List[Tuple[int, int, int]] = []
    pos = 0
    for v in range(v0, v0 + span):
        o, c = blocks[(v + root) % n]
        if out and out[-1][0] + out[-1][2] == o:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + c)
        elif c:
            out.append((o, pos, c))
        pos += c
    return out


def _span_count(blocks: Blocks, root: int, n: int, v0: int, span: int) -> int:
    return sum(blocks[(v + root) % n][1] for v in range(v0, v0 + span))


def gather_direct(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks, root: int) -> None:
    """The root receives every block at once; the others send theirs."""
    n, r = p.size, p.rank
    if r != root:
        if send.size:
            p.exchange([(root, send)])
        return
    o, c = blocks[r]
    own = (lambda: p.copy(recv[o:o + c], send)) if c else None
    recvs = [(j, recv[oj:oj + cj], None) for j, (oj, cj) in enumerate(blocks) if j != r and cj]
    p.exchange([], recvs, meanwhile=own)


def _children(v: int, n: int) -> List[Tuple[int, int]]:
    """(relative rank, subtree size) of each child of relative rank ``v`` in the binomial tree of ``n``."""
    span, kids, m = _subtree(v, n), [], 1
    while m < span:
        if v + m < n:
            kids.append((v + m, _subtree(v + m, n)))
        m <<= 1
    return kids


def gather_tree(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks, root: int) -> None:
    """Binomial gather: each rank collects its subtree's blocks (in relative-rank order) and sends them to
    its parent in one message. The root receives each child's subtree straight into recvbuf where the
    blocks lie there in that order, else through scratch."""
    n, r = p.size, p.rank
    v = (r - root) % n
    span, kids = _subtree(v, n), _children(v, n)
    if r == root:
        recvs, later = [], []
        for k, ks in kids:
            runs = _runs(blocks, root, n, k, ks)
            total = _span_count(blocks, root, n, k, ks)
            if not total:
                continue
            if len(runs) == 1:
                recvs.append(((k + root) % n, recv[runs[0][0]:runs[0][0] + total], None))
            else:
                tmp = p.scratch(total, recv.dtype, _TREE_SLOT + k.bit_length())
                recvs.append(((k + root) % n, tmp, None))
                later.append((tmp, runs))
        o, c = blocks[r]
        p.exchange([], recvs, meanwhile=(lambda: p.copy(recv[o:o + c], send)) if c else None)
        for tmp, runs in later:
            for uo, so, c in runs:
                p.copy(recv[uo:uo + c], tmp[so:so + c])
        return
    parent = ((v - (v & -v)) + root) % n
    total = _span_count(blocks, root, n, v, span)
    if not kids:
        if total:
            p.exchange([(parent, send)])
        return
    tmp = p.scratch(total, send.dtype, _TREE_SLOT)
    mine = send.size
    recvs = []
    for k, ks in kids:
        c = _span_count(blocks, root, n, k, ks)
        if c:
            recvs.append(((k + root) % n, tmp[mine:mine + c], None))
        mine += c
    p.exchange([], recvs, meanwhile=(lambda: p.copy(tmp[:send.size], send)) if send.size else None)
    if total:
        p.exchange([(parent, tmp[:total])])


def scatter_direct(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks, root: int) -> None:
    """The root sends every block at once; the others receive theirs."""
    n, r = p.size, p.rank
    if r != root:
        if recv.size:
            p.exchange([], [(root, recv, None)])
        return
    o, c = blocks[r]
    sends = [(j, send[oj:oj + cj]) for j, (oj, cj) in enumerate(blocks) if j != r and cj]
    p.exchange(sends, [], meanwhile=(lambda: p.copy(recv, send[o:o + c])) if c else None)


def scatter_tree(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks, root: int) -> None:
    """Binomial scatter: each rank receives its subtree's blocks in one message from its parent, keeps its
    own and passes each child its subtree's (straight from sendbuf at the root where they lie in order)."""
    n, r = p.size, p.rank
    v = (r - root) % n
    span, kids = _subtree(v, n), _children(v, n)
    sends = []
    if r == root:
        for k, ks in kids:
            runs = _runs(blocks, root, n, k, ks)
            total = _span_count(blocks, root, n, k, ks)
            if not total:
                continue
            if len(runs) == 1:
                part = send[runs[0][0]:runs[0][0] + total]
            else:
                part = p.scratch(total, send.dtype, _TREE_SLOT + k.bit_length())
                for uo, so, c in runs:
                    p.copy(part[so:so + c], send[uo:uo + c])
            sends.append(((k + root) % n, part))
        o, c = blocks[r]
        p.exchange(sends, [], meanwhile=(lambda: p.copy(recv, send[o:o + c])) if c else None)
        return
    parent = ((v - (v & -v)) + root) % n
    total = _span_count(blocks, root, n, v, span)
    if not kids:
        if total:
            p.exchange([], [(parent, recv, None)])
        return
    tmp = p.scratch(total, recv.dtype, _TREE_SLOT)
    if total:
        p.exchange([], [(parent, tmp[:total], None)])
    at = recv.size
    for k, ks in kids:
        c = _span_count(blocks, root, n, k, ks)
        if c:
            sends.append(((k + root) % n, tmp[at:at + c]))
        at += c
    p.exchange(sends, [], meanwhile=(lambda: p.copy(recv, tmp[:recv.size])) if recv.size else None)


def all_gather_v_direct(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks) -> None:
    """Each rank's block broadcast to every other rank, all at once (one step, n-1 messages each way)."""
    n, r = p.size, p.rank
    o, c = blocks[r]
    own = (lambda: p.copy(recv[o:o + c], send)) if c and not p.mem.shares(recv[o:o + c], send) else None
    sends = [(j, send) for j in range(n) if j != r and c]
    recvs = [(j, recv[oj:oj + cj], None) for j, (oj, cj) in enumerate(blocks) if j != r and cj]
    p.exchange(sends, recvs, meanwhile=own)


def all_gather_v_ring(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks) -> None:
    """n-1 steps: at step s each rank passes block r-s to its right and takes block r-s-1 from its left;
    the first step sends from sendbuf while the own block is copied into place."""
    n, r = p.size, p.rank
    o, c = blocks[r]
    own = (lambda: p.copy(recv[o:o + c], send)) if c and not p.mem.shares(recv[o:o + c], send) else None
    if n == 1:
        if own is not None:
            own()
        return
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        so, sc = blocks[(r - s) % n]
        ro, rc = blocks[(r - s - 1) % n]
        out = send if s == 0 else recv[so:so + sc]
        p.exchange([(right, out)], [(left, recv[ro:ro + rc], None)], meanwhile=own if s == 0 else None)


def reduce_scatter_v_direct(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks,
                            op: ReduceOp) -> None:
    """Block j of every rank sent straight to rank j, which combines them in rank order (the same bits
    whatever order they arrived in)."""
    n, r = p.size, p.rank
    o, c = blocks[r]
    sends = [(j, send[oj:oj + cj]) for j, (oj, cj) in enumerate(blocks) if j != r and cj]
    if not c:
        if sends:
            p.exchange(sends, [])
        return
    got = p.scratch(n * c, send.dtype, _RED_SLOT)
    recvs = [(j, got[j * c:(j + 1) * c], None) for j in range(n) if j != r]
    p.exchange(sends, recvs)
    parts = [send[o:o + c] if j == r else got[j * c:(j + 1) * c] for j in range(n)]
    if n == 1:
        p.copy(recv, parts[0])
        return
    p.reduce(recv, parts[0], parts[1], op)
    for part in parts[2:]:
        p.reduce(recv, recv, part, op)


def reduce_scatter_v_ring(p: Primitives, send: np.ndarray, recv: np.ndarray, blocks: Blocks,
                          op: ReduceOp) -> None:
    """n-1 steps: the partial sum of block r-s-2 arrives from the left, is combined with this rank's own
    block on arrival and passed right; after the last step this rank's block is whole in recvbuf."""
    n, r = p.size, p.rank
    blk = lambda i: send[blocks[i % n][0]:blocks[i % n][0] + blocks[i % n][1]]  # noqa: E731
    if n == 1:
        p.copy(recv, blk(r))
        return
    right, left = (r + 1) % n, (r - 1) % n
    big = max(c for _, c in blocks)
    bufs = [p.scratch(big, send.dtype, 0), p.scratch(big, send.dtype, 1)]
    outgoing = blk(r - 1)
    for s in range(n - 1):
        target = blk(r - s - 2)
        acc = recv if s == n - 2 else bufs[s % 2][:target.size]
        p.exchange([(right, outgoing)], [(left, acc, op, target)])
        outgoing = acc
