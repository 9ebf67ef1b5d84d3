"""gather, scatter, all_gather_v and reduce_scatter_v on one node's compiled hot path: blocks padded to the
largest, run as the hot path's all_gather, broadcast or reduce_scatter (hpccl/host/hotcalls.py), so a small
call costs what the compiled collective does, not a group of messages through Python. Declines (the plan's
schedule runs instead) where padding would move more than twice the bytes of a call above PAD_SLACK, or the
padded call is larger than the hot path takes; every rank declines alike (counts and sizes agree)."""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import numpy as np

from .. import config
from ..host import hotcalls
from ..memory import host
from .call import Call

PAD_SLACK = 16 << 10  # bytes of padding any call may add
_SLOT_IN, _SLOT_OUT = 6, 7  # scratch slots of the communicator's host primitives


def _fits(padded: int, total: int) -> bool:
    return padded <= config.get("HPCCL_HOT_SIZE") and (padded <= 2 * total or padded - total <= PAD_SLACK)


def _hot(comm: Any, coll: str, nbytes: int, args: tuple) -> bool:
    return hotcalls.run(comm, Call(coll, host, None, nbytes, args))


def run(comm: Any, call: Call) -> bool:
    """Run a validated host gather/scatter/v call padded on the hot path; False when it declines."""
    coll, a = call.coll, call.args
    send, recv, blocks = a[0], a[1], a[2]
    n, r = comm.size, comm.rank
    big = max(c for _, c in blocks)
    isz = send.itemsize
    if not _fits(n * big * isz, call.nbytes):
        return False
    p = comm._prim
    if coll == "gather":
        root = a[3]
        out = recv if r == root else p.scratch(n * big, send.dtype, _SLOT_OUT)
        return _hot(comm, "all_gather", n * big * isz, (send, out))
    if coll == "scatter":
        root = a[3]
        if r == root:
            if not _hot(comm, "broadcast", n * big * isz, (send, send, root)):
                return False
            o, c = blocks[r]
            if c and not np.shares_memory(recv, send[o:o + c]):
                p.copy(recv, send[o:o + c])
            return True
        tmp = p.scratch(n * big, recv.dtype, _SLOT_OUT)
        if not _hot(comm, "broadcast", n * big * isz, (tmp, tmp, root)):
            return False
        o, c = blocks[r]
        if c:
            p.copy(recv, tmp[o:o + c])
        return True
    if coll == "all_gather_v":
        if _packed(blocks, big):
            return _hot(comm, "all_gather", n * big * isz, (send, recv))
        mine = p.scratch(big, send.dtype, _SLOT_IN)
        if send.size:
            p.copy(mine[:send.size], send)
        out = p.scratch(n * big, send.dtype, _SLOT_OUT)
        if not _hot(comm, "all_gather", n * big * isz, (mine, out)):
            return False
        for j, (o, c) in enumerate(blocks):
            if c:
                p.copy(recv[o:o + c], out[j * big:j * big + c])
        return True
    # reduce_scatter_v
    op = a[3]
    if _packed(blocks, big):
        return _hot(comm, "reduce_scatter", n * big * isz, (send, recv, op))
    padded = p.scratch(n * big, send.dtype, _SLOT_IN)
    for j, (o, c) in enumerate(blocks):
        if c:
            p.copy(padded[j * big:j * big + c], send[o:o + c])
        if c < big:
            padded[j * big + c:(j + 1) * big] = 0  # never read back; zeros keep the combine free of stale values
    out = p.scratch(big, send.dtype, _SLOT_OUT)
    if not _hot(comm, "reduce_scatter", n * big * isz, (padded, out, op)):
        return False
    if recv.size:
        p.copy(recv, out[:recv.size])
    return True


def _packed(blocks: Sequence[Tuple[int, int]], big: int) -> bool:
    """Every block the same size, in rank order with no gaps: the user's buffers are the padded ones."""
    return all(o == j * big and c == big for j, (o, c) in enumerate(blocks))
