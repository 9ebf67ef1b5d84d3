"""GPU collectives through hpccl's one front end: every collective, dtype x op, in/out of place, odd
counts, every algorithm the table offers on this layout, launch replays and the network's replays from C
(p2p, streams, graphs and errors: test_cuda_streams.py; failures: test_cuda_failures.py).

Collective: run under MPI (`mpirun -n 2 python -m pytest tests/gpu -x -q`); every rank runs the same
tests in the same order. The same file covers one node (GPU kernels over peer memory) and emulated
multi-node layouts (HPCCL_NODE_ID=split:K: hier = node kernels + a network step, or flat schedules across
nodes: staged on the native engine, or with HPCCL_NET=mpi on the network proxy over MPI). HPCCL_TEST_QUICK=1 trims the matrix (4 ranks sharing 2 GPUs time-slice)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hpccl import config
from hpccl.errors import HpcclInvalidArgument, HpcclUnsupported
from hpccl.ops import AVG, MAX, MIN, PROD, SUM

from gpu_util import FLOATS, assert_close, have_torch, np_dtype, poison, rank_data, reference, to_dev, to_host

QUICK = os.environ.get("HPCCL_TEST_QUICK") == "1"
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
OPS = (SUM, PROD, MIN, MAX, AVG)


def algos(comm, coll):
    """Every algorithm the one table offers for device memory on this communicator's layout."""
    names = comm.algorithms(coll, "cuda")
    assert names, f"no device algorithm for {coll}"
    return names


class forced:
    """HPCCL_ALGO for one collective, for the duration of a with-block."""

    def __init__(self, comm, coll, algo):
        self.comm, self.coll, self.algo = comm, coll, algo

    def __enter__(self):
        self.comm._planner.force(self.coll, self.algo)

    def __exit__(self, *exc):
        self.comm._planner.force(self.coll, None)


def _sizes():
    return (1, 13, 4099) if QUICK else (1, 13, 4099, 65536 + 8, (1 << 20) + 3)


def test_layout_routes_device_calls(world):
    """One node: kernels only; several nodes: hier (equal nodes of >1 rank) and network schedules."""
    comm, dev = world
    names = algos(comm, "all_reduce")
    if comm.num_nodes == 1:
        assert set(names) == {"oneshot", "twoshot"}
    else:
        assert "oneshot" not in names and "ring" in names
        assert ("hier" in names) == (comm.local_size > 1)


@pytest.mark.parametrize("name", DTYPES)
def test_all_reduce_dtype_op(world, name):
    comm, dev = world
    for algo in algos(comm, "all_reduce"):
        with forced(comm, "all_reduce", algo):
            for op in OPS:
                if op is AVG and name not in FLOATS:
                    with pytest.raises(HpcclInvalidArgument):
                        comm.all_reduce(to_dev(rank_data(name, 4, 0, 0, SUM), dev), None, op)
                    continue
                for count in _sizes():
                    data = [rank_data(name, count, r, 1, op) for r in range(comm.size)]
                    want = reference(name, op, data)
                    x = to_dev(data[comm.rank], dev)
                    y = to_dev(np.zeros(count, np_dtype(name)), dev)
                    poison(y)
                    comm.all_reduce(x, y, op)
                    assert_close(name, to_host(y), want, f"{algo} {name} {op.value} n={count} out of place",
                                 hops=comm.size - 1 if comm.num_nodes > 1 else 1)
                    comm.all_reduce(x, None, op)  # in place
                    assert_close(name, to_host(x), want, f"{algo} {name} {op.value} n={count} in place",
                                 hops=comm.size - 1 if comm.num_nodes > 1 else 1)


@pytest.mark.parametrize("name", ["int32", "float16", "bfloat16", "float32"] if QUICK else DTYPES)
def test_reduce_scatter(world, name):
    comm, dev = world
    n = comm.size
    for algo in algos(comm, "reduce_scatter"):
        with forced(comm, "reduce_scatter", algo):
            for op in (SUM, MAX) if name not in FLOATS else (SUM, AVG, MIN):
                for count in (1, 1000, 70001) if not QUICK else (1, 1000):
                    data = [rank_data(name, count * n, r, 2, op) for r in range(n)]
                    want = reference(name, op, data)[comm.rank * count:(comm.rank + 1) * count]
                    x = to_dev(data[comm.rank], dev)
                    y = comm.reduce_scatter(x, None, op)
                    assert_close(name, to_host(y), want, f"{algo} reduce_scatter {name} {op.value} {count}",
                                 hops=n - 1 if comm.num_nodes > 1 else 1)
                    # in place: the output is this rank's own block of the input
                    comm.reduce_scatter(x, x[comm.rank * count:(comm.rank + 1) * count], op)
                    assert_close(name, to_host(x)[comm.rank * count:(comm.rank + 1) * count], want,
                                 f"{algo} rs in place", hops=n - 1 if comm.num_nodes > 1 else 1)


@pytest.mark.parametrize("count", [1, 5, 4096, 300001])
def test_all_gather(world, count):
    comm, dev = world
    n = comm.size
    for algo in algos(comm, "all_gather"):
        with forced(comm, "all_gather", algo):
            data = [rank_data("float32", count, r, 3, SUM) for r in range(n)]
            x = to_dev(data[comm.rank], dev)
            y = comm.all_gather(x)
            assert tuple(y.shape) == (n, count)
            np.testing.assert_array_equal(to_host(y), np.stack(data), err_msg=algo)
            z = to_dev(np.zeros(n * count, np.float32), dev)
            poison(z)
            z[comm.rank * count:(comm.rank + 1) * count] = x
            comm.all_gather(z[comm.rank * count:(comm.rank + 1) * count], z)   # in place
            np.testing.assert_array_equal(to_host(z), np.concatenate(data), err_msg=algo)
            for name in ("int8", "bfloat16"):  # odd byte counts; the dtype CuPy lacks
                b = [rank_data(name, count, r, 4, SUM) for r in range(n)]
                yb = comm.all_gather(to_dev(b[comm.rank], dev))
                np.testing.assert_array_equal(to_host(yb).view(np.uint8), np.stack(b).view(np.uint8),
                                              err_msg=f"{algo} {name}")


@pytest.mark.parametrize("count", [3, 4097, 1 << 20])
def test_broadcast_reduce(world, count):
    comm, dev = world
    n = comm.size
    for root in range(n):
        for algo in algos(comm, "broadcast"):
            with forced(comm, "broadcast", algo):
                src = rank_data("float32", count, root, 5, SUM)
                buf = to_dev(src if comm.rank == root else np.zeros(count, np.float32), dev)
                comm.broadcast(buf, root)
                np.testing.assert_array_equal(to_host(buf), src, err_msg=f"{algo} root {root}")
                out = to_dev(np.zeros(count, np.float32), dev)
                comm.broadcast(to_dev(src if comm.rank == root else np.zeros(count, np.float32), dev), root,
                               recvbuf=out)
                np.testing.assert_array_equal(to_host(out), src, err_msg=f"{algo} root {root} out of place")
        for algo in algos(comm, "reduce"):
            with forced(comm, "reduce", algo):
                for name, op in (("int64", SUM), ("bfloat16", MAX), ("float32", AVG)):
                    data = [rank_data(name, count, r, 6, op) for r in range(n)]
                    x = to_dev(data[comm.rank], dev)
                    y = to_dev(np.zeros(count, np_dtype(name)), dev)
                    comm.reduce(x, y, root, op)
                    if comm.rank == root:
                        assert_close(name, to_host(y), reference(name, op, data), f"{algo} reduce {name} {root}")
                    np.testing.assert_array_equal(to_host(x).view(np.uint8), data[comm.rank].view(np.uint8))


@pytest.mark.parametrize("count", [1, 1000, 1 << 18])
def test_all_to_all(world, count):
    comm, dev = world
    n = comm.size
    for algo in algos(comm, "all_to_all"):
        with forced(comm, "all_to_all", algo):
            data = [rank_data("int32", count * n, r, 7, SUM) for r in range(n)]
            want = np.concatenate([data[s][comm.rank * count:(comm.rank + 1) * count] for s in range(n)])
            x = to_dev(data[comm.rank], dev)
            y = comm.all_to_all(x)
            np.testing.assert_array_equal(to_host(y), want, err_msg=algo)
            comm.all_to_all(x, x)  # in place
            np.testing.assert_array_equal(to_host(x), want, err_msg=f"{algo} in place")


@pytest.mark.parametrize("scale", [1, 50000])
def test_gather_scatter_and_the_v_collectives(world, scale):
    """gather, scatter, all_gather_v and reduce_scatter_v on CuPy arrays (one group of sends and receives on
    a side stream whose inputs were ordered after their making), against numpy references; uneven counts
    with zeros."""
    import cupy
    from hpccl.ops import MAX
    comm, dev = world
    n, r = comm.size, comm.rank
    side = cupy.cuda.Stream(non_blocking=True)
    counts = [((q * 5 + 3) % 4) * scale for q in range(n)]
    data = [rank_data("float32", 3 * scale * n, q, 11, SUM) for q in range(n)]
    xs = to_dev(data[r][:3 * scale], dev)
    xa = to_dev(data[r][:counts[r]], dev)
    xr = to_dev(data[r][:sum(counts)], dev)
    root = n - 1
    g = to_dev(np.full(3 * scale * n, -1, np.float32), dev) if r == root else None
    sc = to_dev(np.full(3 * scale, -1, np.float32), dev)
    av = to_dev(np.full(sum(counts), -1, np.float32), dev)
    rs = to_dev(np.full(counts[r], -1, np.float32), dev)
    full = to_dev(data[r], dev)
    side.wait_event(cupy.cuda.get_current_stream().record())
    comm.gather(xs, g, root=root, stream=side)
    comm.scatter(full if r == root else None, sc, root=root, stream=side)
    comm.all_gather_v(xa, av, counts, stream=side)
    comm.reduce_scatter_v(xr, rs, counts, MAX, stream=side)
    side.synchronize()
    comm.synchronize()
    if r == root:
        np.testing.assert_array_equal(to_host(g), np.concatenate([d[:3 * scale] for d in data]))
    np.testing.assert_array_equal(to_host(sc), data[root][r * 3 * scale:(r + 1) * 3 * scale])
    np.testing.assert_array_equal(to_host(av), np.concatenate([data[q][:counts[q]] for q in range(n)]))
    o = sum(counts[:r])
    want = np.max(np.stack([d[:sum(counts)] for d in data]), axis=0)[o:o + counts[r]]
    np.testing.assert_array_equal(to_host(rs), want)


def test_gather_scatter_and_the_v_collectives_captured(world):
    """The four captured in one CUDA graph on a side stream (their temporaries kept while the graph may replay,
    no host sync inside) and replayed 50 times, the inputs bumped inside the graph before each replay's calls;
    across nodes without the engine's staged steps: refused before anything is enqueued."""
    import cupy
    comm, dev = world
    n, r = comm.size, comm.rank
    counts = [((q * 5 + 3) % 4) * 1000 for q in range(n)]  # zeros included
    root = n - 1
    xs = cupy.full(3000, r, dtype=cupy.float32)
    xa = cupy.full(counts[r], r, dtype=cupy.float32)
    xr = cupy.full(sum(counts), r, dtype=cupy.float32)
    full = cupy.repeat(cupy.arange(n, dtype=cupy.float32), 3000)
    g = cupy.zeros(3000 * n, dtype=cupy.float32) if r == root else None
    sc = cupy.zeros(3000, dtype=cupy.float32)
    av = cupy.zeros(sum(counts), dtype=cupy.float32)
    rs = cupy.zeros(counts[r], dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()

    def calls():
        comm.gather(xs, g, root=root, stream=s)
        comm.scatter(full if r == root else None, sc, root=root, stream=s)
        comm.all_gather_v(xa, av, counts, stream=s)
        comm.reduce_scatter_v(xr, rs, counts, SUM, stream=s)
    calls()  # warm-up: kernels loaded and first-use allocations made outside the capture
    s.synchronize()
    if comm.num_nodes > 1 and not comm._net_capturable():
        with s:
            s.begin_capture()
            try:
                with pytest.raises(HpcclUnsupported, match="CUDA graph"):
                    comm.all_gather_v(xa, av, counts, stream=s)
            finally:
                graph = s.end_capture()
        del graph
        return
    with s:
        s.begin_capture()
        for a in (xs, xa, xr, full):
            a += 1
        calls()
        graph = s.end_capture()
    replays = 50
    for _ in range(replays):
        graph.launch(s)
    s.synchronize()
    k = float(replays)
    if r == root:
        np.testing.assert_array_equal(cupy.asnumpy(g), np.repeat(np.arange(n, dtype=np.float32) + k, 3000))
    assert float(sc.min()) == float(sc.max()) == r + k
    np.testing.assert_array_equal(cupy.asnumpy(av), np.repeat(np.arange(n, dtype=np.float32) + k, counts))
    if counts[r]:
        assert float(rs.min()) == float(rs.max()) == sum(q + k for q in range(n))
    comm.synchronize()


@pytest.mark.parametrize("scale", [1, 100000])
def test_all_to_all_v(world, scale):
    """Uneven blocks with zeros and gaps, on a side stream whose inputs were ordered after their making."""
    import cupy
    comm, dev = world
    n, r = comm.size, comm.rank

    def cnt(a, b):
        return 0 if (a + 2 * b) % 3 == 0 else ((a * 7 + b * 3) % 5 + 1) * scale
    data = [rank_data("float32", sum(cnt(q, j) for j in range(n)), q, 9, SUM) for q in range(n)]
    sc, rc = [cnt(r, j) for j in range(n)], [cnt(j, r) for j in range(n)]
    rd, pos = [0] * n, 0
    for j in reversed(range(n)):  # reverse rank order, one-element gaps
        rd[j], pos = pos + 1, pos + 1 + rc[j]
    x = to_dev(data[r], dev)
    out = to_dev(np.full(pos, -1, np.float32), dev)
    side = cupy.cuda.Stream(non_blocking=True)
    side.wait_event(cupy.cuda.get_current_stream().record())
    comm.all_to_all_v(x, out, sc, rc, rdispls=rd, stream=side)
    side.synchronize()
    got = to_host(out)
    want = np.full(pos, -1, np.float32)
    for j in range(n):
        jc = [cnt(j, k) for k in range(n)]
        want[rd[j]:rd[j] + rc[j]] = data[j][sum(jc[:r]):sum(jc[:r + 1])]
    np.testing.assert_array_equal(got, want)


def test_compiled_launch_replays(world):
    """Repeated calls replay their launch snapshot through the compiled driver calls (hpccl/csrc/_hotpath.c)
    when it is built, with correct results."""
    import cupy
    from hpccl.host import hotpath
    comm, dev = world
    if not hotpath.available():
        pytest.skip("hpccl/csrc/_hotpath.c is not built here (no C compiler when hpccl was installed)")
    if not config.get("HPCCL_COMPILED_LAUNCH"):
        pytest.skip("HPCCL_COMPILED_LAUNCH=0 in this run (the default, 1, runs it)")
    eng = comm._dev.engine if comm._dev is not None else None
    if eng is None:
        pytest.skip("the kernel engine serves one node; this layout runs GPU calls on the network proxy")
    assert eng.compiled_launch is not None
    x = cupy.ones(1000, dtype=cupy.float32)
    seq = eng.fs.seq
    for _ in range(5):
        comm.all_reduce(x)
    comm.synchronize()
    assert eng.fs.seq == seq + 5 and float(x[0]) == comm.size ** 5


def test_one_rank_in_place_moves_nothing(world):
    """A communicator of one rank: in-place calls launch nothing, first call and snapshot replays alike (as
    NCCL at one rank), and out-of-place calls still copy the input to the output."""
    import cupy
    comm, dev = world
    solo = comm.split(comm.rank, 0)
    try:
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        ref = x.copy()
        for _ in range(3):  # the 2nd and 3rd replay the snapshot
            solo.all_reduce(x)
            solo.broadcast(x)
            solo.all_gather(x, x)
            solo.reduce_scatter(x, x)
        solo.all_reduce(x, op=AVG)
        eng = solo._dev.engine
        from hpccl.gpu.cuda_comm import NOTHING
        assert eng is not None and eng.last[0] is NOTHING and NOTHING in eng._fast.values()
        y = cupy.empty_like(x)
        solo.all_reduce(x, y)
        z = cupy.empty_like(x)
        solo.all_gather(x, z)
        solo.synchronize()
        assert bool((x == ref).all()) and bool((y == ref).all()) and bool((z == ref).all())
    finally:
        solo.destroy()


def test_force_drops_launch_snapshots(world):
    """A repeated call replays its launch snapshot, keyed by buffers; after Tuner.force picks another
    algorithm, the next call must run that algorithm, not replay the old one (the replay was the cause of
    the two-shot failures with ranks sharing a GPU: ranks whose allocators reused a pointer differently ran
    different kernels in one call)."""
    import cupy
    comm, dev = world
    if comm.num_nodes > 1 or comm.size < 2:
        pytest.skip("launch snapshots are made by the one-node kernel engine with 2+ ranks")
    x = cupy.ones(1 << 12, dtype=cupy.float32)
    with forced(comm, "all_reduce", "oneshot"):
        for _ in range(3):
            comm.all_reduce(x)  # the 2nd and 3rd replay the snapshot
    with forced(comm, "all_reduce", "twoshot"):
        comm.all_reduce(x)
        assert comm._rec.calls()[-1]["algorithm"] == "twoshot"
    comm.synchronize()
    assert float(x[0]) == comm.size ** 4


@pytest.fixture(params=["python", "door"])
def replay_way(request, world, monkeypatch):
    """How repeated calls across nodes reach their recordings: NetReplays.fire from Python, or the C front
    door (hpccl/csrc/_netdoor.c, HPCCL_NET_DOOR=1) at each collective's entry; every recording is made
    again under that way and dropped afterwards. Yields the door (None: the Python way)."""
    from hpccl.gpu import netreplay
    comm, _dev = world
    reps = comm._device().replays  # the GPU side is built at the first device call (collective)
    if reps is None:
        pytest.skip("replays serve GPU calls across nodes with one rank per node (HPCCL_NODE_ID=split:1 "
                    f"and the network engine); this layout has {comm.num_nodes} node(s), "
                    f"{comm.local_size} rank(s) per node")
    saved = comm._door
    reps.drop()
    reps.door, comm._door = None, None
    if request.param == "door":
        monkeypatch.setenv("HPCCL_NET_DOOR", "1")
        comm._door = netreplay.door(comm, reps, comm._dev.keys)
        assert comm._door is not None, "no door was made (a traced or checked communicator?)"
    try:
        yield comm._door
    finally:
        reps.drop()
        reps.door = None
        comm._door = saved
        if saved is not None:
            reps.door = saved


def test_network_calls_replay_from_c(world, replay_way):
    """Across nodes with one rank per node, a repeated call is enqueued from its recording by one C call
    (hpccl/csrc/_netreplay.c), reached from Python or through the C front door: every collective, small and
    sliced sizes, two streams alternating, the input written on the stream just before each call and the
    output checked just after, no host sync; then the odd ranks stop replaying while the even ones go on
    (the messages agree either way)."""
    import cupy
    comm, dev = world
    reps, door = comm._dev.replays, replay_way
    n, r = comm.size, comm.rank
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    bad = cupy.zeros(6, dtype=cupy.int64)  # wrong elements per collective
    cupy.cuda.get_current_stream().synchronize()
    iters = 12

    def run(count: int) -> None:
        x = cupy.zeros(count * n, dtype=cupy.float32)
        y = cupy.zeros(count * n, dtype=cupy.float32)
        g = cupy.zeros(count * n * n, dtype=cupy.float32)
        o = cupy.zeros(count, dtype=cupy.float32)
        blocks = cupy.repeat(cupy.arange(n, dtype=cupy.float32), count)
        cupy.cuda.get_current_stream().synchronize()
        tot = n * (n - 1) // 2
        ev = None
        for i in range(iters):
            s = streams[i % 2]
            with s:
                if ev is not None:  # the last iteration's checks (on the other stream) read before we write
                    s.wait_event(ev)
                x.fill(float(i + r))
                comm.all_reduce(x, y, stream=s)
                bad[0] += (y != float(n * i + tot)).sum()
                comm.all_reduce(x, y, AVG, stream=s)
                bad[1] += (cupy.abs(y - (n * i + tot) / n) > 1e-3).sum()
                comm.all_gather(x[:count], g[:count * n], stream=s)
                bad[2] += (g[:count * n] != blocks + i).sum()
                comm.reduce_scatter(x, o, MAX, stream=s)
                bad[3] += (o != float(i + n - 1)).sum()
                comm.broadcast(x, root=(i % n), stream=s)
                bad[4] += (x != float(i + i % n)).sum()
                x.fill(float(i + r))
                comm.all_to_all(x, y, stream=s)
                bad[5] += (y != blocks + i).sum()
                ev = s.record()
        for s in streams:
            s.synchronize()

    before, seq0 = reps.replayed, comm._seq
    for count in (13, (1 << 20) + 5):  # one step, and steps in 1 MiB slices
        run(count)
    assert bad.tolist() == [0] * 6
    # each key's first call is recorded: 2 streams, and n roots x 2 streams for broadcast
    assert reps.replayed - before >= 2 * (5 * (iters - 2) + iters - 2 * n), reps.replayed - before
    assert comm._seq - seq0 == 2 * 6 * iters  # every call numbered, through the door or not
    if door is not None:  # every replay went through the door, and is in the statistics
        assert door.fired == reps.replayed - before
        stats = comm.stats()
        assert sum(v["calls"] for c in stats.values() for k, v in c.items() if k == "replayed (cuda)") >= door.fired
    saved = comm._dev.replays
    if r % 2:
        comm._dev.replays, comm._door = None, None  # these ranks run every call in Python from here on
    try:
        done = reps.replayed
        run(4099)
        assert bad.tolist() == [0] * 6
        assert (reps.replayed > done) == (r % 2 == 0)
    finally:
        comm._dev.replays, comm._door = saved, door
    comm.synchronize()


def test_torch_tensors_replay_across_nodes(world, replay_way):
    """A repeated call on a CUDA tensor, with torch's stream handle given (as the torch backend calls) and with
    none (torch's current stream), replays from its recording, through the door when it is on. The input is
    written on the stream just before each call and the result checked just after."""
    if not have_torch():
        pytest.skip("torch with CUDA is not available")
    import torch
    comm, dev = world
    reps, door = comm._dev.replays, replay_way
    n = comm.size
    side = torch.cuda.Stream()
    t = torch.zeros(4099, dtype=torch.float32, device=f"cuda:{dev}")
    bad = torch.zeros(2, dtype=torch.int64, device=f"cuda:{dev}")
    side.wait_stream(torch.cuda.current_stream())
    before = reps.replayed
    with torch.cuda.stream(side):
        for i in range(10):
            t.fill_(float(comm.rank + i))
            comm.all_reduce(t, stream=side.cuda_stream)
            bad[0] += (t != float(n * i + n * (n - 1) // 2)).sum()
        for i in range(4):
            t.fill_(float(comm.rank + i))
            comm.all_reduce(t)  # torch's current stream (side): the same key
            bad[1] += (t != float(n * i + n * (n - 1) // 2)).sum()
    side.synchronize()
    assert bad.tolist() == [0, 0]
    assert reps.replayed - before == 13, reps.replayed - before  # every call but the first (recorded)
    if door is not None:  # every call but the first, torch's current stream read by the door too
        assert door.fired == 13, door.fired
    comm.synchronize()
