"""gather, scatter, all_gather_v and reduce_scatter_v against numpy references (every rank count the
suite runs at, odd ones included), and their validation: a clear error naming the argument before any
data moves."""
import numpy as np
import pytest

import hpccl
from hpccl import HpcclInvalidArgument
from hpccl.ops import MAX, SUM


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    yield c
    c.destroy()


def _counts(n, seed):
    rng = np.random.default_rng(seed)
    return [int(c) for c in rng.integers(0, 7, size=n)]


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_gather_and_scatter(comm, dtype):
    n, r = comm.size, comm.rank
    for root in range(n):
        x = np.arange(5, dtype=dtype) + 100 * r
        out = np.full(5 * n, -1, dtype) if r == root else None
        got = comm.gather(x, out, root=root)
        if r == root:
            assert got is out
            np.testing.assert_array_equal(out.reshape(n, 5), np.arange(5, dtype=dtype) + 100 * np.arange(n)[:, None])
        else:
            assert got is None
        src = (np.arange(3 * n, dtype=dtype) + 1000 * root) if r == root else None
        y = np.full(3, -1, dtype)
        assert comm.scatter(src, y, root=root) is y
        np.testing.assert_array_equal(y, np.arange(3 * r, 3 * r + 3, dtype=dtype) + 1000 * root)


def test_all_gather_v(comm):
    n, r = comm.size, comm.rank
    for seed in range(3):
        counts = _counts(n, seed)
        x = np.full(counts[r], r + 1, np.float64)
        out = np.full(sum(counts), -1.0)
        assert comm.all_gather_v(x, out, counts) is out
        np.testing.assert_array_equal(out, np.concatenate([np.full(c, q + 1.0) for q, c in enumerate(counts)]))
    counts = [2] * n
    displs = [3 * q for q in range(n)]  # gaps between the blocks stay untouched
    out = np.full(3 * n, -7, np.int32)
    comm.all_gather_v(np.full(2, r, np.int32), out, counts, displs)
    want = np.full(3 * n, -7, np.int32)
    for q in range(n):
        want[3 * q:3 * q + 2] = q
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("op", [SUM, MAX])
def test_reduce_scatter_v(comm, op):
    n, r = comm.size, comm.rank
    for seed in range(3):
        counts = _counts(n, seed + 10)
        data = [np.random.default_rng(100 + q).integers(-50, 50, size=sum(counts)).astype(np.float32)
                for q in range(n)]
        out = np.full(counts[r], -1.0, np.float32)
        assert comm.reduce_scatter_v(data[r], out, counts, op) is out
        ref = (np.sum if op is SUM else np.max)(np.stack(data), axis=0)
        o = sum(counts[:r])
        np.testing.assert_array_equal(out, ref[o:o + counts[r]])


def test_bad_input_names_the_argument(comm):
    n, r = comm.size, comm.rank
    x = np.zeros(4, np.float32)
    with pytest.raises(HpcclInvalidArgument, match="root"):
        comm.gather(x, np.zeros(4 * n, np.float32), root=n)
    if r == 0:
        with pytest.raises(HpcclInvalidArgument, match="recvbuf"):
            comm.gather(x, np.zeros(4 * n + 1, np.float32), root=0)
        with pytest.raises(HpcclInvalidArgument, match="sendbuf"):
            comm.scatter(np.zeros(4 * n - 1, np.float32), x, root=0)
    with pytest.raises(HpcclInvalidArgument, match="recvcounts"):
        comm.all_gather_v(x, np.zeros(4 * n, np.float32), [4] * (n + 1))
    with pytest.raises(HpcclInvalidArgument, match="sendbuf"):
        comm.all_gather_v(np.zeros(3, np.float32), np.zeros(4 * n, np.float32), [4] * n)
    with pytest.raises(HpcclInvalidArgument, match="recvbuf"):
        comm.all_gather_v(x, np.zeros(4 * n, np.float64), [4] * n)
    with pytest.raises(HpcclInvalidArgument, match="sendbuf"):
        comm.reduce_scatter_v(np.zeros(4 * n + 1, np.float32), x, [4] * n)
    with pytest.raises(HpcclInvalidArgument, match="recvbuf"):
        comm.reduce_scatter_v(np.zeros(4 * n, np.float32), np.zeros(3, np.float32), [4] * n)
    # nothing moved: the communicator is still usable
    y = np.full(2, r + 1, np.float32)
    comm.all_reduce(y)
    assert y[0] == n * (n + 1) / 2


SCHEDULES = {"gather": ["direct", "tree"], "scatter": ["direct", "tree"], "all_gather_v": ["direct", "ring"],
             "reduce_scatter_v": ["direct", "ring"]}


@pytest.fixture
def forced(comm):
    """Pin a collective to one schedule of the algorithm table (as HPCCL_ALGO=coll:name does); undone after."""
    pinned = []

    def pin(coll, algo):
        comm._planner.force(coll, algo)
        pinned.append(coll)
        if algo is not None:  # the plan the planner now makes runs that schedule
            assert comm._planner.plan(coll, 64, "host").algo == algo
    yield pin
    for coll in pinned:
        comm._planner.force(coll, None)


@pytest.mark.parametrize("algo", ["direct", "tree", None])
def test_gather_scatter_each_schedule_every_root(comm, forced, algo):
    n, r = comm.size, comm.rank
    forced("gather", algo)
    forced("scatter", algo)
    for c in (0, 1, 5, 3000):  # 3000 x 8 B x n: past the padded hot path's bytes
        for root in range(n):
            x = np.arange(c, dtype=np.int64) * 7 + 1000 * r
            out = np.full(c * n, -1, np.int64) if r == root else None
            comm.gather(x, out, root=root)
            if r == root:
                np.testing.assert_array_equal(out.reshape(n, c), np.arange(c) * 7 + 1000 * np.arange(n)[:, None])
            src = np.arange(c * n, dtype=np.int64) - 5 * root if r == root else None
            y = np.full(c, -1, np.int64)
            comm.scatter(src, y, root=root)
            np.testing.assert_array_equal(y, np.arange(c * r, c * r + c) - 5 * root)


def _uneven_cases(n):
    """Counts with zeros (every rank but one empty, alternate ranks empty, random) and one large case."""
    one = [0] * n
    one[n - 1] = 4
    yield one
    yield [0 if q % 2 else q + 3 for q in range(n)]
    yield _counts(n, 7)
    yield [(q + 1) * 2000 for q in range(n)]


@pytest.mark.parametrize("algo", ["direct", "ring", None])
def test_all_gather_v_each_schedule(comm, forced, algo):
    n, r = comm.size, comm.rank
    forced("all_gather_v", algo)
    for counts in _uneven_cases(n):
        x = np.arange(counts[r], dtype=np.float32) + 10 * r
        out = np.full(sum(counts), -1, np.float32)
        comm.all_gather_v(x, out, counts)
        np.testing.assert_array_equal(out, np.concatenate([np.arange(c, dtype=np.float32) + 10 * q
                                                           for q, c in enumerate(counts)]))
        # blocks in reverse rank order with a one-element gap after each: the gaps stay untouched
        displs, at = [0] * n, 0
        for q in reversed(range(n)):
            displs[q], at = at, at + counts[q] + 1
        out = np.full(at, -3, np.float32)
        comm.all_gather_v(x, out, counts, displs)
        for q in range(n):
            np.testing.assert_array_equal(out[displs[q]:displs[q] + counts[q]],
                                          np.arange(counts[q], dtype=np.float32) + 10 * q)
            assert out[displs[q] + counts[q]] == -3


@pytest.mark.parametrize("algo", ["direct", "ring", None])
@pytest.mark.parametrize("op", [SUM, MAX])
def test_reduce_scatter_v_each_schedule(comm, forced, algo, op):
    n, r = comm.size, comm.rank
    forced("reduce_scatter_v", algo)
    for counts in _uneven_cases(n):
        data = [np.random.default_rng(7 + q).integers(-50, 50, size=sum(counts)).astype(np.float64)
                for q in range(n)]
        out = np.full(counts[r], -1.0)
        comm.reduce_scatter_v(data[r], out, counts, op)
        ref = (np.sum if op is SUM else np.max)(np.stack(data), axis=0)
        o = sum(counts[:r])
        np.testing.assert_array_equal(out, ref[o:o + counts[r]])


def test_planner_pads_small_calls_onto_the_hot_path(comm):
    """Where the communicator has a compiled hot path serving all_gather, a small gather is planned onto it
    (blocks padded; across nodes only at 2 ranks); a schedule of the table is what runs when it declines."""
    p = comm._planner.plan("gather", 256, "host")
    if "all_gather" in comm._planner.hot_colls and (comm.num_nodes == 1 or comm.size <= 2):
        assert p.route == "hot" and p.algo == "padded" and p.fallback.algo in SCHEDULES["gather"]
    else:
        assert p.route == "schedule" and p.algo in SCHEDULES["gather"]
