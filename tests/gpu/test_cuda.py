"""CUDA path of hpccl: every collective, dtype x op, in/out of place, p2p, graphs, stress, errors.

Collective: run under MPI (`mpirun -n 2 python -m pytest tests/gpu -x -q`); every rank runs the same
tests in the same order. HPCCL_TEST_QUICK=1 trims the matrix (4 ranks sharing 2 GPUs time-slice)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hpccl.errors import HpcclInvalidArgument, HpcclTimeoutError
from hpccl.ops import AVG, MAX, MIN, PROD, SUM

from gpu_util import (FLOATS, assert_close, have_torch, np_dtype, poison, rank_data, reference, to_dev,
                      to_host)

QUICK = os.environ.get("HPCCL_TEST_QUICK") == "1"
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
OPS = (SUM, PROD, MIN, MAX, AVG)


@pytest.fixture(scope="module")
def world():
    import cupy
    import hpccl
    from hpccl.cuda_comm import CudaComm
    comm = hpccl.Communicator()
    ndev = cupy.cuda.runtime.getDeviceCount()
    dev = comm.local_rank % ndev
    cupy.cuda.Device(dev).use()
    if have_torch():
        import torch
        torch.cuda.set_device(dev)
    cc = CudaComm(comm)
    yield comm, cc, dev
    cc.close()
    comm.destroy()


def _force(cc, algo):
    cc.retune(algo or None)


def _sizes():
    return (1, 13, 4099) if QUICK else (1, 13, 4099, 65536 + 8, (1 << 20) + 3)


@pytest.mark.parametrize("algo", ["oneshot", "twoshot"])
@pytest.mark.parametrize("name", DTYPES)
def test_all_reduce_dtype_op(world, name, algo):
    comm, cc, dev = world
    _force(cc, algo)
    try:
        for op in OPS:
            if op is AVG and name not in FLOATS:
                with pytest.raises(HpcclInvalidArgument):
                    cc.all_reduce(to_dev(rank_data(name, 4, 0, 0, SUM), dev), None, op)
                continue
            for count in _sizes():
                data = [rank_data(name, count, r, 1, op) for r in range(comm.size)]
                want = reference(name, op, data)
                x = to_dev(data[comm.rank], dev)
                y = to_dev(np.zeros(count, np_dtype(name)), dev)
                poison(y)
                cc.all_reduce(x, y, op)
                assert_close(name, to_host(y), want, f"{algo} {name} {op.value} n={count} out of place")
                cc.all_reduce(x, None, op)  # in place
                assert_close(name, to_host(x), want, f"{algo} {name} {op.value} n={count} in place")
    finally:
        _force(cc, "")


@pytest.mark.parametrize("name", ["int32", "float16", "bfloat16", "float32"] if QUICK else DTYPES)
def test_reduce_scatter(world, name):
    comm, cc, dev = world
    n = comm.size
    for op in (SUM, MAX) if name not in FLOATS else (SUM, AVG, MIN):
        for count in (1, 1000, 70001) if not QUICK else (1, 1000):
            data = [rank_data(name, count * n, r, 2, op) for r in range(n)]
            want = reference(name, op, data)[comm.rank * count:(comm.rank + 1) * count]
            x = to_dev(data[comm.rank], dev)
            y = cc.reduce_scatter(x, None, op)
            assert_close(name, to_host(y), want, f"reduce_scatter {name} {op.value} {count}")
            # in place: the output is this rank's own block of the input
            cc.reduce_scatter(x, x[comm.rank * count:(comm.rank + 1) * count], op)
            assert_close(name, to_host(x)[comm.rank * count:(comm.rank + 1) * count], want, "rs in place")


@pytest.mark.parametrize("count", [1, 5, 4096, 300001])
def test_all_gather(world, count):
    comm, cc, dev = world
    n = comm.size
    data = [rank_data("float32", count, r, 3, SUM) for r in range(n)]
    x = to_dev(data[comm.rank], dev)
    y = cc.all_gather(x)
    assert tuple(y.shape) == (n, count)
    np.testing.assert_array_equal(to_host(y), np.stack(data))
    z = to_dev(np.zeros(n * count, np.float32), dev)
    poison(z)
    z[comm.rank * count:(comm.rank + 1) * count] = x
    cc.all_gather(z[comm.rank * count:(comm.rank + 1) * count], z)   # in place
    np.testing.assert_array_equal(to_host(z), np.concatenate(data))
    b = [rank_data("int8", count, r, 4, SUM) for r in range(n)]  # odd byte counts
    yb = cc.all_gather(to_dev(b[comm.rank], dev))
    np.testing.assert_array_equal(to_host(yb), np.stack(b))


@pytest.mark.parametrize("count", [3, 4096, 1 << 20])
def test_broadcast_reduce(world, count):
    comm, cc, dev = world
    n = comm.size
    for root in range(n):
        src = rank_data("float32", count, root, 5, SUM)
        buf = to_dev(src if comm.rank == root else np.zeros(count, np.float32), dev)
        cc.broadcast(buf, root)
        np.testing.assert_array_equal(to_host(buf), src)
        out = to_dev(np.zeros(count, np.float32), dev)
        cc.broadcast(to_dev(src if comm.rank == root else np.zeros(count, np.float32), dev), root, out)
        np.testing.assert_array_equal(to_host(out), src)
        data = [rank_data("int64", count, r, 6, SUM) for r in range(n)]
        x = to_dev(data[comm.rank], dev)
        y = to_dev(np.zeros(count, np.int64), dev)
        cc.reduce(x, y, root, SUM)
        if comm.rank == root:
            np.testing.assert_array_equal(to_host(y), reference("int64", SUM, data))
        np.testing.assert_array_equal(to_host(x), data[comm.rank])  # input untouched


@pytest.mark.parametrize("count", [1, 1000, 1 << 18])
def test_all_to_all(world, count):
    comm, cc, dev = world
    n = comm.size
    data = [rank_data("int32", count * n, r, 7, SUM) for r in range(n)]
    want = np.concatenate([data[s][comm.rank * count:(comm.rank + 1) * count] for s in range(n)])
    x = to_dev(data[comm.rank], dev)
    y = cc.all_to_all(x)
    np.testing.assert_array_equal(to_host(y), want)
    cc.all_to_all(x, x)  # in place
    np.testing.assert_array_equal(to_host(x), want)


@pytest.mark.parametrize("nbytes", [1, 4096, 1 << 20, 40 << 20])
def test_send_recv(world, nbytes):
    comm, cc, dev = world
    n, r = comm.size, comm.rank
    count = max(1, nbytes // 4)
    right, left = (r + 1) % n, (r - 1) % n
    mine = rank_data("float32", count, r, 8, SUM)
    x = to_dev(mine, dev)
    y = to_dev(np.zeros(count, np.float32), dev)
    cc.group_p2p([(right, x)], [(left, y)])   # ring shift, both directions at once
    np.testing.assert_array_equal(to_host(y), rank_data("float32", count, left, 8, SUM))
    z = to_dev(np.zeros(count, np.float32), dev)
    cc.group_p2p([(r, x)], [(r, z)])          # to self
    np.testing.assert_array_equal(to_host(z), mine)
    if n >= 2:  # plain send/recv, ordered by rank parity so nothing deadlocks
        if r % 2 == 0 and r + 1 < n:
            cc.send(x, r + 1)
            cc.recv(y, r + 1)
            np.testing.assert_array_equal(to_host(y), rank_data("float32", count, r + 1, 8, SUM))
        elif r % 2 == 1:
            cc.recv(y, r - 1)
            cc.send(x, r - 1)
            np.testing.assert_array_equal(to_host(y), rank_data("float32", count, r - 1, 8, SUM))


def test_back_to_back_stress(world):
    """Thousands of collectives without a host sync in between; one check at the end."""
    import cupy
    comm, cc, dev = world
    n = comm.size
    iters = 300 if QUICK else 3000
    sizes = [1, 7, 256, 4096, 65536, 200003]
    bufs = [cupy.full(s, comm.rank + 1, dtype=cupy.float32) for s in sizes]
    outs = [cupy.zeros(s, dtype=cupy.float32) for s in sizes]
    for i in range(iters):
        k = i % len(sizes)
        cc.all_reduce(bufs[k], outs[k], MAX if i % 3 else SUM)
        if i % 97 == 0:
            cc.all_gather(bufs[k][:1])
    cc.synchronize()
    tot = n * (n + 1) / 2
    for k, s in enumerate(sizes):
        last = max(i for i in range(iters) if i % len(sizes) == k)
        want = float(n) if last % 3 else tot
        assert float(outs[k].min()) == want and float(outs[k].max()) == want, (s, last)


def test_cuda_graph_capture_replay(world):
    import cupy
    comm, cc, dev = world
    n = comm.size
    count = 1 << 16
    x = cupy.full(count, comm.rank, dtype=cupy.float32)
    y = cupy.zeros(count, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()
    cc.barrier(stream=s)  # establishes the stream order before the capture
    s.synchronize()
    with s:
        s.begin_capture()
        for _ in range(4):
            x += 1
            cc.all_reduce(x, y, SUM, stream=s)
        g = s.end_capture()
    replays = 50
    for _ in range(replays):
        g.launch(s)
    s.synchronize()
    k = 4 * replays
    want = sum(r + k for r in range(n))
    assert float(y.min()) == want and float(y.max()) == want


def test_torch_tensors(world):
    if not have_torch():
        pytest.skip("torch with CUDA is not available")
    import torch
    comm, cc, dev = world
    n = comm.size
    t = torch.full((1000, 3), float(comm.rank + 1), dtype=torch.bfloat16, device=f"cuda:{dev}")
    cc.all_reduce(t)  # on torch's current stream
    torch.cuda.current_stream().synchronize()
    assert float(t.float().min()) == n * (n + 1) / 2
    side = torch.cuda.Stream()
    u = torch.arange(8, dtype=torch.float32, device=f"cuda:{dev}") * (comm.rank + 1)
    with torch.cuda.stream(side):
        g = cc.all_gather(u, None, stream=side)
    side.synchronize()
    assert g.shape == (n, 8)
    for r in range(n):
        assert torch.equal(g[r].cpu(), torch.arange(8, dtype=torch.float32) * (r + 1))


def test_invalid_arguments(world):
    import cupy
    comm, cc, dev = world
    x = cupy.zeros(10, dtype=cupy.float32)
    with pytest.raises(HpcclInvalidArgument):
        cc.all_reduce(x, cupy.zeros(11, dtype=cupy.float32))
    with pytest.raises(HpcclInvalidArgument):
        cc.all_reduce(x, cupy.zeros(10, dtype=cupy.float64))
    with pytest.raises(HpcclInvalidArgument):
        cc.all_reduce(cupy.zeros((4, 4), dtype=cupy.float32)[:, 1])
    with pytest.raises(HpcclInvalidArgument):
        cc.all_reduce(cupy.zeros(10, dtype=cupy.int32), None, AVG)
    with pytest.raises(HpcclInvalidArgument):
        cc.all_reduce(cupy.zeros(10, dtype=cupy.complex64))
    if comm.size > 1:
        with pytest.raises(HpcclInvalidArgument):
            cc.reduce_scatter(cupy.zeros(comm.size * 3 + 1, dtype=cupy.float32))
    with pytest.raises(HpcclInvalidArgument):
        cc.all_reduce(x, stream="nope")
    cc.all_reduce(x)  # still usable: errors were raised before any work
    cc.synchronize()


def test_through_communicator(world):
    """The integration contract: Communicator delegates CUDA buffers to CudaComm (comm.py)."""
    import inspect
    import cupy
    comm, cc, dev = world
    if "stream" not in inspect.signature(type(comm).all_reduce).parameters:
        pytest.skip("this comm.py does not route CUDA buffers yet (no stream= keyword)")
    n = comm.size
    x = cupy.full(1024, comm.rank + 1.0, dtype=cupy.float32)
    comm.all_reduce(x)
    assert float(x[0]) == n * (n + 1) / 2
    y = comm.all_gather(cupy.full(3, comm.rank, dtype=cupy.int32))
    assert cupy.asnumpy(y).tolist() == [[r] * 3 for r in range(n)]


def test_host_memory_fallback(world, monkeypatch):
    """No-P2P path (staging in pinned shared host memory), forced with HPCCL_CUDA_TRANSPORT=host."""
    import cupy
    import hpccl
    from hpccl.cuda_comm import CudaComm
    comm0, _, dev = world
    monkeypatch.setenv("HPCCL_CUDA_TRANSPORT", "host")
    monkeypatch.setenv("HPCCL_CUDA_BUFFER_SIZE", "4M")
    comm = hpccl.Communicator()
    cc = CudaComm(comm)
    try:
        assert cc.transport == "host"
        n = comm.size
        for count in (5, 100000, 1 << 20):
            data = [rank_data("float32", count, r, 9, SUM) for r in range(n)]
            x = to_dev(data[comm.rank], dev)
            cc.all_reduce(x)
            assert_close("float32", to_host(x), reference("float32", SUM, data), "host all_reduce")
            g = cc.all_gather(to_dev(data[comm.rank], dev))
            np.testing.assert_array_equal(to_host(g), np.stack(data))
        y = cupy.zeros(1 << 20, dtype=cupy.float32)
        cc.group_p2p([((comm.rank + 1) % n, cupy.full(1 << 20, comm.rank, dtype=cupy.float32))],
                     [((comm.rank - 1) % n, y)])
        assert float(y[0]) == (comm.rank - 1) % n
    finally:
        cc.close()
        comm.destroy()


def test_timeout_is_reported(monkeypatch):
    """A rank that never arrives: the GPU wait times out, the host raises HpcclTimeoutError."""
    import cupy
    import hpccl
    from hpccl.cuda_comm import CudaComm
    monkeypatch.setenv("HPCCL_TIMEOUT", "2")
    monkeypatch.setenv("HPCCL_CUDA_BUFFER_SIZE", "4M")
    comm = hpccl.Communicator()
    if comm.size < 2:
        comm.destroy()
        pytest.skip("needs 2 ranks")
    cc = CudaComm(comm)
    try:
        if comm.rank == 0:
            cc.all_reduce(cupy.ones(16, dtype=cupy.float32))
            with pytest.raises(HpcclTimeoutError):
                cc.synchronize()
    finally:
        cc.close()
        try:
            comm.destroy()
        except Exception:  # noqa: BLE001
            pass
