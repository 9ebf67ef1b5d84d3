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
