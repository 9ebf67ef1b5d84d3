"""gather, scatter, all_gather_v and reduce_scatter_v on a compiled hot path (one node's, or the network
engine's with one rank per node): blocks padded to the largest, run as that path's all_gather, broadcast or
reduce_scatter (reduce_scatter_v as an all_reduce of the whole input where the path has no reduce_scatter),
so a small call costs what the compiled collective does, not messages through Python. Declines (the plan's
schedule runs instead) above PAD_MAX bytes, where padding would more than double a call's bytes (beyond
PAD_SLACK), or where the hot path does not take the call; every rank declines alike (counts and sizes agree)."""
from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np

from ..errors import HpcclError
from ..host import hotcalls
from ..memory import host
from ..memory.interop import HOST
from .call import Call
from .planner import HOT, PADDED

PAD_SLACK = 16 << 10  # bytes of padding any call may add
PAD_MAX = 64 << 10  # padded bytes above which the schedules (no extra copies, no extra bytes) measured faster
_SLOT_IN, _SLOT_OUT = 6, 7  # scratch slots of the communicator's host primitives


def run(comm: Any, call: Call) -> bool:
    """Run a validated host gather/scatter/v call (inside Communicator._run) padded on the hot path; False
    when it declines."""
    def hot(coll: str, nbytes: int, args: tuple) -> bool:
        return hotcalls.run(comm, Call(coll, host, None, nbytes, args))
    base = next(b for b in PADDED[call.coll] if b in comm._planner.hot_colls)
    return _padded(comm, call.coll, call.args, call.nbytes, base, hot)


def front(comm: Any, coll: str, args: tuple, nbytes: int) -> bool:
    """The same before Communicator._run, as the hot path's front door takes a call (no HPCCL_CHECK, dumps
    or trace: the front door is open): the compiled call counts itself; False when it declines."""
    front, base = comm._front, None
    for b in PADDED[coll]:
        if b in front:
            base = b
            break
    if base is None or comm._planner.plan(coll, nbytes, HOST).route != HOT:
        return False
    door = front[base]

    def hot(c: str, nb: int, a: tuple) -> bool:
        try:  # as Communicator._front_door makes its call
            if c == "broadcast":
                rc = door.broadcast(a[0], None, a[2], comm._seq + 1)
            elif c == "reduce_scatter" or c == "all_reduce":
                rc = getattr(door, c)(a[0], a[1], hotcalls.OPCODE[a[2]], comm._seq + 1)
            else:
                rc = door.all_gather(a[0], a[1], comm._seq + 1)
        except (HpcclError, OSError) as exc:
            hotcalls.door_raised(comm, exc, c)
        return hotcalls.door_done(comm, door, c, rc)
    return _padded(comm, coll, args, nbytes, base, hot)


def _padded(comm: Any, coll: str, a: tuple, nbytes: int, base: str, hot: Callable[[str, int, tuple], bool]) -> bool:
    """``coll`` run as the hot path's ``base`` through ``hot``; False when it declines."""
    send, recv, blocks = a[0], a[1], a[2]
    n, r = comm.size, comm.rank
    big = blocks[0][1] if coll == "gather" or coll == "scatter" else max(c for _, c in blocks)
    isz = send.itemsize
    padded = nbytes if base == "all_reduce" else n * big * isz
    if padded > PAD_MAX or (padded > 2 * nbytes and padded - nbytes > PAD_SLACK):
        return False
    p = comm._prim
    if coll == "gather":
        root = a[3]
        out = recv if r == root else _scr(p, n * big, send.dtype, _SLOT_OUT)
        return hot("all_gather", n * big * isz, (send, out))
    if coll == "scatter":
        root = a[3]
        if r == root:
            if not hot("broadcast", n * big * isz, (send, send, root)):
                return False
            o, c = blocks[r]
            if c and not np.shares_memory(recv, send[o:o + c]):
                p.copy(recv, send[o:o + c])
            return True
        tmp = _scr(p, n * big, recv.dtype, _SLOT_OUT)
        if not hot("broadcast", n * big * isz, (tmp, tmp, root)):
            return False
        o, c = blocks[r]
        if c:
            p.copy(recv, tmp[o:o + c])
        return True
    if coll == "all_gather_v":
        if _packed(blocks, big):
            return hot("all_gather", n * big * isz, (send, recv))
        mine = _scr(p, big, send.dtype, _SLOT_IN)
        if send.size:
            p.copy(mine[:send.size], send)
        out = _scr(p, n * big, send.dtype, _SLOT_OUT)
        if not hot("all_gather", n * big * isz, (mine, out)):
            return False
        for j, (o, c) in enumerate(blocks):
            if c:
                p.copy(recv[o:o + c], out[j * big:j * big + c])
        return True
    op = a[3]  # reduce_scatter_v
    if base == "all_reduce":  # the whole (packed) input reduced everywhere; this rank keeps its block
        out = _scr(p, send.size, send.dtype, _SLOT_OUT)
        if not hot("all_reduce", nbytes, (send, out, op)):
            return False
        o, c = blocks[r]
        if c:
            p.copy(recv, out[o:o + c])
        return True
    if _packed(blocks, big):
        return hot("reduce_scatter", n * big * isz, (send, recv, op))
    padded = _scr(p, n * big, send.dtype, _SLOT_IN)
    for j, (o, c) in enumerate(blocks):
        if c:
            p.copy(padded[j * big:j * big + c], send[o:o + c])
        if c < big:
            padded[j * big + c:(j + 1) * big] = 0  # never read back; zeros keep the combine free of stale values
    out = _scr(p, big, send.dtype, _SLOT_OUT)
    if not hot("reduce_scatter", n * big * isz, (padded, out, op)):
        return False
    if recv.size:
        p.copy(recv, out[:recv.size])
    return True


def _packed(blocks: Sequence[Tuple[int, int]], big: int) -> bool:
    """Every block the same size, in rank order with no gaps: the user's buffers are the padded ones."""
    return all(o == j * big and c == big for j, (o, c) in enumerate(blocks))


def _scr(p: Any, count: int, dtype: np.dtype, slot: int) -> Any:
    """p.scratch(count, dtype, slot), the view kept while the slot's memory stays (small calls repeat)."""
    views = p.__dict__.setdefault("_pad_views", {})
    key = (count, dtype, slot)
    hit = views.get(key)
    if hit is not None and hit[0] is p._scratch.get(slot):
        return hit[1]
    a = p.scratch(count, dtype, slot)
    if len(views) > 64:
        views.clear()
    views[key] = (p._scratch[slot], a)
    return a
