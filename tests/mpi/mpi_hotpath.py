"""The compiled hot path (hpccl/csrc/_hotpath.c) for small host collectives, run inside each rank under
mpiexec: it is the path in use, it is correct against numpy, ranks passing different kinds of buffers
still agree on the path, and calls it declines (sizes, dtypes) interleave with it safely."""
from __future__ import annotations

import array

import numpy as np
import pytest
from common import ALL_DTYPES, close, data, reduce_ref, valid_ops

import hpccl
from hpccl import config
from hpccl.host import hotpath
from hpccl.ops import SUM


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    if c.size < 2:
        c.destroy()
        pytest.skip("the hot path serves 2 or more ranks of a node (this run has 1)")
    yield c
    c.destroy()


def test_compiled_path_is_in_use(comm):
    assert hotpath.available(), "hpccl/csrc/_hotpath.c was not built: pip install needs a C compiler"
    hot = comm._hot
    assert hot is not None and "hot" in comm.algorithms("all_reduce")
    assert all(c in comm._planner.hot_colls for c in hotpath.COLLECTIVES)
    # past the slots, all_reduce is on the hot path only where it goes direct between the processes
    direct = int(comm._prim.single_copy and 0 < 16 * config.get("HPCCL_HOT_DIRECT_SIZE") <= (1 << 20))
    before = hot.calls
    x = np.ones(16, np.float32)
    comm.all_reduce(x)
    assert hot.calls == before + 1 and x[0] == comm.size
    big = np.ones(config.get("HPCCL_HOT_SIZE") // 4 + 1, np.float32)  # one element past the slot
    comm.all_reduce(big)
    half = np.ones(16, np.float16)  # half precision: declined, reduced in Python
    comm.all_reduce(half)
    assert hot.calls == before + 1 + direct and big[-1] == comm.size and half[0] == comm.size
    comm.barrier()
    assert hot.calls == before + 2 + direct
    per = config.get("HPCCL_HOT_REDUCE_SIZE") // 4 + 1  # past the reduction limit, within the slot
    y = np.ones(per, np.float32)
    comm.all_reduce(y)
    assert hot.calls == before + 2 + 2 * direct and y[-1] == comm.size  # else Python's schedules
    g = comm.all_gather(y)
    assert hot.calls == before + 3 + 2 * direct and g.shape == (comm.size, per)  # all_gather of the same: hot


def test_every_collective_dtype_and_op(comm):
    n, r = comm.size, comm.rank
    for dtype in ALL_DTYPES:
        for count in (1, 5, 999):
            for op in valid_ops(dtype):
                x = data(count, dtype, r, count, op)
                want = reduce_ref([data(count, dtype, q, count, op) for q in range(n)], op)
                assert close(comm.all_reduce(x, np.empty_like(x), op=op), want, op), (dtype, op, count)
                assert close(comm.all_reduce(x, op=op), want, op), (dtype, op, count, "in place")
                s = data(n * count, dtype, r, count, op)
                full = reduce_ref([data(n * count, dtype, q, count, op) for q in range(n)], op)
                got = comm.reduce_scatter(s, np.empty(count, dtype), op=op)
                assert close(got, full[r * count:(r + 1) * count], op), (dtype, op, count, "reduce_scatter")
                root = count % n
                out = np.full(count, 7, dtype)
                comm.reduce(data(count, dtype, r, count, op), out, root=root, op=op)
                assert close(out, want, op) if r == root else (out == 7).all(), (dtype, op, count, "reduce")
            a = data(n * count, dtype, r, count)
            got = comm.all_to_all(a, np.empty_like(a))
            want_a = np.concatenate([data(n * count, dtype, q, count)[r * count:(r + 1) * count] for q in range(n)])
            assert np.array_equal(got, want_a), (dtype, count, "all_to_all")
            g = np.empty((n, count), dtype)
            comm.all_gather(data(count, dtype, r), g)
            assert np.array_equal(g, np.stack([data(count, dtype, q) for q in range(n)])), (dtype, count)
            for root in range(n):
                b = data(count, dtype, r, root)
                comm.broadcast(b, root)
                assert np.array_equal(b, data(count, dtype, root, root)), (dtype, count, root)


def test_ranks_passing_different_buffers_agree(comm):
    """Rank 0 passes a memoryview, rank 1 an array.array, the others numpy arrays: the first two are
    validated in Python, the rest go straight to C, and all of them must take the same path."""
    n, r = comm.size, comm.rank
    before = comm._hot.calls
    for _ in range(20):
        if r == 0:  # a memoryview input, out of place
            x = np.empty(100)
            comm.all_reduce(memoryview(np.full(100, r + 1.0)), x)
        elif r == 1:
            x = array.array("d", [r + 1.0] * 100)
            comm.all_reduce(x)
        else:
            x = np.full(100, r + 1.0)
            comm.all_reduce(x)
        assert list(np.asarray(x)) == [n * (n + 1) / 2] * 100
    assert comm._hot.calls == before + 20


def test_interleaved_with_declined_calls(comm):
    """A random mix (the same on every rank) of sizes below and above HPCCL_HOT_SIZE and dtypes the hot
    path declines: every result checked, so a slot reused too early or a path taken by some ranks only
    would show."""
    n, r = comm.size, comm.rank
    rng = np.random.default_rng(7)
    cap = config.get("HPCCL_HOT_SIZE")
    dtypes = [np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16), np.dtype(np.uint8)]
    for i in range(300):
        dtype = dtypes[rng.integers(len(dtypes))]
        nbytes = int(rng.choice([8, 1000, cap, cap + 64, 3 * cap]))
        count = max(1, nbytes // dtype.itemsize // n) * n
        kind = rng.integers(4)
        if kind == 0:
            x = data(count, dtype, r, i)
            comm.all_reduce(x)
            assert close(x, reduce_ref([data(count, dtype, q, i) for q in range(n)], SUM), SUM), (i, dtype, count)
        elif kind == 1:
            c = count // n
            g = comm.all_gather(data(c, dtype, r, i))
            assert np.array_equal(g.reshape(-1), np.concatenate([data(c, dtype, q, i) for q in range(n)])), i
        elif kind == 2:
            root = int(rng.integers(n))
            b = data(count, dtype, r, i)
            comm.broadcast(b, root)
            assert np.array_equal(b, data(count, dtype, root, i)), (i, root)
        else:
            c = count // n
            full = reduce_ref([data(count, dtype, q, i) for q in range(n)], SUM)
            got = comm.reduce_scatter(data(count, dtype, r, i))
            assert close(got, full[r * c:(r + 1) * c], SUM), (i, dtype, count)


def test_direct_broadcast_any_mix_of_buffers(comm):
    """Broadcasts from HPCCL_HOT_DIRECT_SIZE bytes move between the processes (the root writes the head of
    every peer's output, the peers read the rest): every root, sizes around the threshold, odd byte counts
    and several times the slot, each rank choosing in place or out of place on its own; every result and
    the root's input checked, and all of it on the hot path when single-copy reads are allowed."""
    n, r = comm.size, comm.rank
    direct = config.get("HPCCL_HOT_DIRECT_SIZE") if comm._prim.single_copy else 0
    cap = config.get("HPCCL_HOT_SIZE")
    before = comm._hot.calls
    sizes = [max(1, direct - 1), direct, direct + 4097, 3 * 4096 * n + 13, cap + 5, 3 * cap]
    calls = 0
    for i, nbytes in enumerate(sizes):
        for root in range(n):
            want = data(nbytes, np.dtype(np.uint8), root, i)
            mine = data(nbytes, np.dtype(np.uint8), r, i)
            keep = mine.copy()
            if (r + i + root) % 2:  # out of place: the input must stay as it was, on the root too
                out = np.full(nbytes, 7, np.uint8)
                comm.broadcast(mine, root, recvbuf=out)
                assert np.array_equal(out, want), (nbytes, root, "out of place")
                assert np.array_equal(mine, keep) or r != root, (nbytes, root, "the root's input changed")
            else:
                comm.broadcast(mine, root)
                assert np.array_equal(mine, want), (nbytes, root, "in place")
            calls += nbytes <= cap or (direct and nbytes >= direct)
    if direct:
        assert comm._hot.calls == before + calls, "a direct broadcast left the hot path"


def test_direct_all_gather_all_to_all_reduce_scatter(comm):
    """all_gather, all_to_all and reduce_scatter from HPCCL_HOT_DIRECT_SIZE bytes per rank (all_to_all from 8
    times that, reduce_scatter from 4 times) read every peer's input directly: sizes around both thresholds and past the slots, out of place, in
    place (all_gather: sendbuf is this rank's block of recvbuf; all_to_all: recvbuf is sendbuf), and an input
    that overlaps another block of the output (copied to scratch first); every result and the inputs
    checked, all of it on the hot path when single-copy reads are allowed."""
    n, r = comm.size, comm.rank
    direct = config.get("HPCCL_HOT_DIRECT_SIZE") if comm._prim.single_copy else 0
    cap = config.get("HPCCL_HOT_SIZE")
    u8 = np.dtype(np.uint8)
    before, calls = comm._hot.calls, 0
    for i, per in enumerate([max(n, direct - n), direct, direct * 16, cap + 8 * n, 3 * cap]):
        per -= per % n
        hot_ag = per <= cap or (direct and per >= direct)
        hot_a2a = per <= cap or (direct and per >= 8 * direct)
        ins = [data(per, u8, q, i) for q in range(n)]
        want_ag = np.concatenate(ins)
        out = np.full(n * per, 7, u8)
        comm.all_gather(ins[r].copy(), out)
        assert np.array_equal(out, want_ag), (per, "all_gather")
        out = np.full(n * per, 7, u8)
        out[r * per:(r + 1) * per] = ins[r]
        comm.all_gather(out[r * per:(r + 1) * per], out)
        assert np.array_equal(out, want_ag), (per, "all_gather in place")
        out = np.full(n * per, 7, u8)  # the input in another block of the output (numpy: straight to C)
        other = (r + 1) % n
        out[other * per:(other + 1) * per] = ins[r]
        comm.all_gather(out[other * per:(other + 1) * per], out)
        assert np.array_equal(out, want_ag), (per, "all_gather, input in another block")
        calls += 3 * hot_ag
        blk = per // n
        want_a2a = np.concatenate([ins[q][r * blk:(r + 1) * blk] for q in range(n)])
        x = ins[r].copy()
        got = comm.all_to_all(x, np.empty(per, u8))
        assert np.array_equal(got, want_a2a) and np.array_equal(x, ins[r]), (per, "all_to_all")
        comm.all_to_all(x, x)
        assert np.array_equal(x, want_a2a), (per, "all_to_all in place")
        calls += 2 * hot_a2a
        f64 = np.dtype(np.float64)  # reduce_scatter: sum and avg, out of place and in place
        full = [data(per, f64, q, i) for q in range(n)]
        c = per // n
        for op in (SUM, hpccl.AVG):
            want = reduce_ref(full, op)[r * c:(r + 1) * c]
            got = comm.reduce_scatter(full[r].copy(), np.empty(c, f64), op=op)
            assert close(got, want, op), (per, op, "reduce_scatter")
            x = full[r].copy()
            comm.reduce_scatter(x, x[r * c:(r + 1) * c], op=op)
            assert close(x[r * c:(r + 1) * c], want, op), (per, op, "reduce_scatter in place")
            calls += 2 * (per * 8 <= cap or (direct and per * 8 >= 4 * direct))
    if direct:
        assert comm._hot.calls == before + calls, "a direct call left the hot path"


def test_direct_all_reduce(comm):
    """all_reduce from 16 x HPCCL_HOT_DIRECT_SIZE bytes per rank: each rank reduces its stripe from every
    peer's input, then copies the peers' stripes out of their outputs. Counts that do not divide by the
    ranks, int and float dtypes, sum/max/avg, out of place, in place, an output overlapping the input
    (numpy: straight to C, which copies the input first); every rank's result bitwise the same."""
    n, r = comm.size, comm.rank
    direct = 16 * config.get("HPCCL_HOT_DIRECT_SIZE") if comm._prim.single_copy else 0
    before, calls = comm._hot.calls, 0
    for i, (dtype, op) in enumerate([(np.float64, SUM), (np.int32, hpccl.MAX), (np.float32, hpccl.AVG)]):
        dt = np.dtype(dtype)
        for count in ([direct // dt.itemsize + 1, 3 * direct // dt.itemsize + 7] if direct else [1 << 16]):
            ins = [data(count, dt, q, i + count, op) for q in range(n)]
            want = reduce_ref(ins, op)
            got = comm.all_reduce(ins[r].copy(), np.empty(count, dt), op=op)
            assert close(got, want, op), (dt, op, count, "out of place")
            x = ins[r].copy()
            comm.all_reduce(x, op=op)
            assert close(x, want, op), (dt, op, count, "in place")
            both = np.zeros(count + 16, dt)  # the output starts 16 elements into the input
            both[:count] = ins[r]
            comm.all_reduce(both[:count], both[16:], op=op)
            assert close(both[16:], want, op), (dt, op, count, "overlapping")
            every = np.empty((n, count), dt)
            comm.all_gather(got, every)
            assert (every == every[0]).all(), (dt, op, count, "ranks differ")
            calls += 4
    if direct:
        assert comm._hot.calls == before + calls, "a direct all_reduce left the hot path"


def _placed(nbytes: int, offset: int, dtype: np.dtype) -> np.ndarray:
    """nbytes of zeros starting ``offset`` bytes into a page."""
    raw = np.zeros(nbytes + 8192, np.uint8)
    start = -raw.ctypes.data % 4096 + offset
    return raw[start:start + nbytes].view(dtype)


# (send offset, recv offset) in the page per rank r: the copies between processes then run from a source
# to a destination 16, 8 or 40 bytes (mod 4096) further on (rep movsb's slow placement, hpccl/csrc/_copy.h), and,
# in the last, every pair of ranks at a different gap, some slow, some not
PLACEMENTS = {"recv 16 past send": lambda r: (0, 16), "8 bytes between ranks": lambda r: (16 * r, 16 * r + 8),
              "every gap": lambda r: (4088 - 24 * r, 40 * r + 4)}


@pytest.mark.parametrize("where", sorted(PLACEMENTS))
def test_direct_calls_at_the_slow_placement(comm, where):
    """Direct calls whose copies meet rep movsb's slow placement (reads bounced at the source's offset, the
    reduce chunks placed likewise, a broadcast root's head write left to the peers, local copies by a vector
    loop) give every byte right: broadcast from every root, all_gather, all_to_all, reduce_scatter and
    all_reduce, sizes across the 64 KiB bounce pieces with odd tails, all on the hot path."""
    n, r = comm.size, comm.rank
    if not comm._prim.single_copy:
        pytest.skip("single-copy reads between processes are off here (HPCCL_SINGLE_COPY or ptrace rules), "
                    "so no call goes direct")
    so, ro = PLACEMENTS[where](r)
    direct = config.get("HPCCL_HOT_DIRECT_SIZE")
    u8, i32 = np.dtype(np.uint8), np.dtype(np.int32)
    before, calls = comm._hot.calls, 0
    for i, per in enumerate([16 * direct + 4 * n, 3 * (64 << 10) + 40 * n]):
        per -= per % (4 * n)
        ins = [data(per, u8, q, i) for q in range(n)]
        for root in range(n):
            send, recv = _placed(per, so, u8), _placed(per, ro, u8)
            send[:] = ins[root] if r == root else 0
            comm.broadcast(send if r == root else recv, root, recvbuf=recv)
            assert np.array_equal(recv, ins[root]), (where, per, root, "broadcast")
        send, recv = _placed(per, so, u8), _placed(n * per, ro, u8)
        send[:] = ins[r]
        comm.all_gather(send, recv)
        assert np.array_equal(recv, np.concatenate(ins)), (where, per, "all_gather")
        recv = _placed(per, ro, u8)
        comm.all_to_all(send, recv)
        blk = per // n
        assert np.array_equal(recv, np.concatenate([ins[q][r * blk:(r + 1) * blk] for q in range(n)])), \
            (where, per, "all_to_all")
        count = per // 4
        full = [data(count, i32, q, i) for q in range(n)]
        want = reduce_ref(full, SUM)
        send, c = _placed(per, so, i32), count // n
        send[:] = full[r]
        recv = _placed(c * 4, ro, i32)
        comm.reduce_scatter(send, recv)
        assert np.array_equal(recv, want[r * c:(r + 1) * c]), (where, per, "reduce_scatter")
        recv = _placed(per, ro, i32)
        comm.all_reduce(send, recv)
        assert np.array_equal(recv, want), (where, per, "all_reduce")
        assert np.array_equal(send, full[r]), (where, per, "an input changed")
        calls += n + 4
    assert comm._hot.calls == before + calls, "a call at the slow placement left the hot path"


def test_bad_buffers_raise_before_anything_moves(comm):
    """A wrong output buffer is declined by C and named by the Python checks; the communicator stays
    usable (the hot path counted nothing for the refused call)."""
    before = comm._hot.calls
    with pytest.raises(hpccl.HpcclInvalidArgument, match="recvbuf"):
        comm.all_reduce(np.ones(8, np.float32), np.empty(7, np.float32))
    with pytest.raises(hpccl.HpcclInvalidArgument, match="recvbuf"):
        comm.all_gather(np.ones(8, np.float32), np.empty(8 * comm.size, np.float64))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(hpccl.HpcclInvalidArgument, match="sendbuf"):
        comm.all_reduce(ro)
    assert comm._hot.calls == before
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    assert x[0] == comm.size
