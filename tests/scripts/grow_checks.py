"""Every call of a communicator once, each result checked against what the ranks put in: the collectives,
the v-collectives, gather/scatter, barrier, and a ring of sends and receives. For a communicator grown over
old and new ranks (tests/scripts/grow_ranks.py and grow_mpi.py, tests/gpu/test_grow_gpu.py). ``xp`` is numpy
or cupy; ``sync`` waits for the GPU (nothing on host buffers); ``kw`` goes to every call (a stream)."""
import os

import numpy as np


def _val(x) -> float:
    return float(x.ravel()[-1]) if x.size else 0.0


def every_call(c, xp=np, sync=lambda: None, kw=None) -> list:
    """Run and check them all; returns the names checked (an AssertionError names the one that was wrong)."""
    kw = kw or {}
    m, me = c.size, c.rank
    tri = m * (m + 1) / 2
    cnt = 1000 * m
    done = []

    def ok(name, cond, got=None):
        assert cond, f"{name} on rank {me} of {m}: {got!r}"
        done.append(name)

    y = c.all_reduce(xp.full(cnt, me + 1, np.float32), **kw); sync()
    ok("all_reduce", bool((y == tri).all()), _val(y))
    g = c.all_gather(xp.full(cnt // m, me, np.int32), **kw); sync()
    want = xp.repeat(xp.arange(m, dtype=np.int32), cnt // m)
    ok("all_gather", bool((g.ravel() == want).all()))
    s = xp.tile(xp.arange(m, dtype=np.float64).repeat(cnt // m), 1) + me  # block j: j + me
    p = c.reduce_scatter(s, **kw); sync()
    ok("reduce_scatter", bool((p == m * me + (tri - m)).all()), _val(p))
    for root in (0, m - 1):
        b = xp.full(cnt, me, np.int64); c.broadcast(b, root=root, **kw); sync()
        ok(f"broadcast(root={root})", bool((b == root).all()), _val(b))
        z = xp.full(cnt, me + 1, np.float32); c.reduce(z, root=root, **kw); sync()
        ok(f"reduce(root={root})", me != root or bool((z == tri).all()), _val(z))
    a = c.all_to_all(xp.arange(cnt, dtype=np.int32) + me * cnt, **kw); sync()
    blk = cnt // m  # block j of rank i's input is i*cnt + j*blk ...; rank me receives block me of every rank
    want = xp.concatenate([xp.arange(blk, dtype=np.int32) + i * cnt + me * blk for i in range(m)])
    ok("all_to_all", bool((a == want).all()))
    counts = [i + 1 for i in range(m)]
    out = xp.zeros(sum(counts), np.float64)
    c.all_gather_v(xp.full(me + 1, me, np.float64), out, counts, **kw); sync()
    ok("all_gather_v", bool((out == xp.repeat(xp.arange(m, dtype=np.float64), counts)).all()))
    rv = xp.zeros(me + 1, np.float64)
    c.reduce_scatter_v(xp.ones(sum(counts), np.float64), rv, counts, **kw); sync()
    ok("reduce_scatter_v", bool((rv == m).all()), _val(rv))
    sc = [2] * m
    av = xp.zeros(2 * m, np.int32)
    c.all_to_all_v(xp.full(2 * m, me, np.int32), av, sc, sc, **kw); sync()
    ok("all_to_all_v", bool((av == xp.arange(m, dtype=np.int32).repeat(2)).all()))
    gat = xp.zeros(4 * m, np.int64) if me == m - 1 else None
    c.gather(xp.full(4, me, np.int64), gat, root=m - 1, **kw); sync()
    ok("gather", me != m - 1 or bool((gat.ravel() == xp.arange(m, dtype=np.int64).repeat(4)).all()))
    rs = xp.zeros(3, np.float32)
    c.scatter(xp.arange(3 * m, dtype=np.float32) if me == 0 else None, rs, root=0, **kw); sync()
    ok("scatter", bool((rs == xp.arange(3 * me, 3 * me + 3, dtype=np.float32)).all()))
    c.barrier(); done.append("barrier")
    if m > 1:
        nxt, prv = (me + 1) % m, (me - 1) % m
        got = xp.zeros(16, np.float64)
        with c.group():
            c.send(xp.full(16, me, np.float64), nxt, **kw)
            c.recv(got, prv, **kw)
        sync()
        ok("send/recv", bool((got == prv).all()), _val(got))
    return done


def buffers():
    """``checked(comm)`` for this process's buffers: BUF numpy (default), or cupy (GPU DEVICE, default 0, a
    stream of its own, each result waited for before it is read); and (xp, kw) for calls of its own."""
    if os.environ.get("BUF", "numpy") != "cupy":
        return (lambda c: every_call(c)), np, {}
    import cupy
    cupy.cuda.Device(int(os.environ.get("DEVICE", "0"))).use()
    stream = cupy.cuda.Stream(non_blocking=True)

    def checked(c) -> list:
        def sync() -> None:
            stream.synchronize()
            c.synchronize()
        return every_call(c, cupy, sync, {"stream": stream})
    return checked, cupy, {"stream": stream}
