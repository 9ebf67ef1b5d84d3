"""The compiled path across nodes (hpccl/csrc/_nethot.c), every rank its own node over the native engine: it
takes the calls it should, gives the Python path's bits, interleaves with Python's messages, declines what
it must, and a size mismatch is an error, not a hang. Run under mpiexec with HPCCL_NODE_ID=split:1."""
from __future__ import annotations

import numpy as np
import pytest
from common import close, data, reduce_ref

import hpccl
from hpccl import config
from hpccl.ops import AVG, MAX, MIN, PROD, SUM


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    if c.num_nodes != c.size or type(c._hot).__name__ != "NetHot":
        c.destroy()
        pytest.skip(f"needs every rank on its own node over the native engine (HPCCL_NODE_ID=split:1); here "
                    f"{c.num_nodes} node(s), transports {[getattr(t, 'impl', t.name) for t in c._transports]}")
    yield c
    c.destroy()


def _hot_calls(comm) -> int:
    return comm._hot.calls


def test_small_calls_take_the_compiled_path(comm):
    before = _hot_calls(comm)
    x = np.arange(16, dtype=np.float32)
    comm.all_reduce(x, np.empty_like(x))
    comm.broadcast(x, root=comm.size - 1)
    comm.all_gather(x)
    comm.reduce(x, np.empty_like(x), root=0)
    comm.barrier()
    assert _hot_calls(comm) - before == 5
    stats = comm.stats()  # counted in C, shown as the 'hot' algorithm
    for coll in ("all_reduce", "broadcast", "all_gather", "reduce", "barrier"):
        assert stats[coll]["hot (host)"]["calls"] >= 1, (coll, stats.get(coll))
    assert stats["all_gather"]["hot (host)"]["bytes"] % (64 * comm.size) == 0  # the output's bytes


def test_c_front_doors_take_the_calls_the_methods_would(comm):
    """Across nodes too, comm.all_reduce/broadcast/all_gather/reduce are C front doors (hpccl/csrc/
    _frontdoor.c) that hand the compiled path the calls the methods would: each takes its call (counted in C),
    gives the method's bits and sequence number, and what the path declines (above HPCCL_NET_HOT_SIZE) runs
    the method's way."""
    for coll in ("all_reduce", "broadcast", "all_gather", "reduce"):
        assert type(comm.__dict__.get(coll)).__name__ == "FrontDoor", coll
    rng = np.random.default_rng(comm.rank)
    for dtype in (np.float32, np.int64):
        x = (rng.standard_normal(257) * 100).astype(dtype)
        for coll, call in (("all_reduce", lambda f, o: f(x, o, MAX)),
                           ("broadcast", lambda f, o: f(x, comm.size - 1, recvbuf=o)),
                           ("all_gather", lambda f, o: f(x, o)),
                           ("reduce", lambda f, o: f(x, o, root=1 % comm.size))):
            outs, seqs = [], []
            for f in (getattr(comm, coll), getattr(type(comm), coll).__get__(comm)):
                out = np.zeros(x.size * (comm.size if coll == "all_gather" else 1), dtype)
                before, seq = _hot_calls(comm), comm._seq
                call(f, out)
                assert _hot_calls(comm) == before + 1, (coll, dtype)
                outs.append(out)
                seqs.append(comm._seq - seq)
            assert np.array_equal(outs[0], outs[1]) and seqs == [1, 1], (coll, dtype, seqs)
    big = np.ones(config.get("HPCCL_NET_HOT_SIZE") // 4 + 1, np.float32)
    before = _hot_calls(comm)
    assert comm.all_reduce(big) is big and np.all(big == comm.size) and _hot_calls(comm) == before


def test_declines_what_python_serves(comm):
    """Above HPCCL_NET_HOT_SIZE, half floats (no C reduction), reduce_scatter and all_to_all: Python."""
    before = _hot_calls(comm)
    big = np.ones(config.get("HPCCL_NET_HOT_SIZE") // 4 + 1, np.float32)
    comm.all_reduce(big)
    assert np.all(big == comm.size)
    h = np.ones(8, np.float16)
    comm.all_reduce(h)
    assert np.all(h == comm.size)
    comm.reduce_scatter(np.ones(4 * comm.size, np.float32))
    comm.all_to_all(np.arange(comm.size, dtype=np.int32))
    assert _hot_calls(comm) == before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bitwise_equal_to_the_python_schedule(comm, dtype):
    """The same recursive doubling in C and in Python (forced 'rd'): identical bits on every rank."""
    x = np.random.default_rng(comm.rank).standard_normal(3001).astype(dtype)
    for op in (SUM, PROD, MIN, MAX, AVG):
        comm._planner.force("all_reduce", "hot")
        c = comm.all_reduce(x, np.empty_like(x), op=op)
        comm._planner.force("all_reduce", "rd")
        p = comm.all_reduce(x, np.empty_like(x), op=op)
        comm._planner.force("all_reduce", None)
        assert np.array_equal(c.view(np.uint8), p.view(np.uint8)), op
        first = comm.broadcast(c.copy(), root=0)
        assert np.array_equal(first.view(np.uint8), c.view(np.uint8)), op  # every rank holds the same bits


def test_interleaved_with_python_calls(comm):
    """Compiled and Python calls alternate (tags from the same per-peer sequence numbers); results right."""
    n, r = comm.size, comm.rank
    big_n = config.get("HPCCL_NET_HOT_SIZE") // 8 + 5
    for i in range(30):
        small = data(1 + i, np.dtype(np.int64), r, i)
        want = reduce_ref([data(1 + i, np.dtype(np.int64), q, i) for q in range(n)], SUM)
        big = np.full(big_n, r + i, np.float64)
        if i % 3 == 0:
            comm.all_reduce(big)
            assert np.all(big == sum(q + i for q in range(n)))
        got = comm.all_reduce(small, np.empty_like(small))
        assert close(got, want, SUM), i
        g = comm.all_gather(np.array([r * 100 + i], np.int32))
        assert g.reshape(-1).tolist() == [q * 100 + i for q in range(n)]
        b = np.array([i] * 3 if r == i % n else [0] * 3, np.uint8)
        comm.broadcast(b, root=i % n)
        assert b.tolist() == [i] * 3


def test_torch_tensors_and_groups(comm):
    torch = pytest.importorskip("torch", reason="torch is not installed; numpy buffers cover the path")
    t = torch.ones(5, dtype=torch.float32)
    comm.all_reduce(t)
    assert t.tolist() == [float(comm.size)] * 5
    with comm.group():
        comm.all_reduce(x := np.ones(3))
    assert x.tolist() == [float(comm.size)] * 3


@pytest.mark.parametrize("algo", ["hot", "rd"])
def test_size_mismatch_across_ranks_is_an_error_not_a_hang(comm, algo):
    """Rank 0 passes 4 elements, the others 8: the ranks it exchanges with raise HpcclInvalidUsage naming the
    sizes, the rest hear of the abort (HpcclRemoteError); nobody waits for HPCCL_TIMEOUT. On the compiled path
    and on Python's (both found a short message that was already there when its receive was posted complete
    and correct, before the engine read its length). On a communicator of its own (it ends aborted)."""
    from mpi4py import MPI
    import time
    c = hpccl.Communicator(MPI.COMM_WORLD.Dup())
    c._planner.force("all_reduce", algo)
    try:
        x = np.ones(4 if c.rank == 0 else 8, np.float32)
        t0 = time.monotonic()
        with pytest.raises((hpccl.HpcclInvalidUsage, hpccl.HpcclRemoteError)) as info:
            c.all_reduce(x, np.empty_like(x))
        took = time.monotonic() - t0
        assert took < min(10.0, config.get("HPCCL_TIMEOUT")), took
        pow2 = c.size & (c.size - 1) == 0
        if c.rank == 0 or (c.rank == 1 and pow2):  # rank 0 and its first partner (3 ranks: rank 2 folds in first)
            assert isinstance(info.value, hpccl.HpcclInvalidUsage), info.value
            assert "sizes or dtypes differ" in str(info.value), info.value
            assert "all_reduce #1" in str(info.value), info.value  # both paths name the call
        with pytest.raises(hpccl.HpcclInvalidUsage):  # aborted: later calls refuse
            c.all_reduce(np.ones(2))
    finally:
        c.destroy()
