"""GPU calls beside the collectives' matrix (tests/gpu/test_cuda.py): another GPU current, sends, receives
and groups, overlapping buffers, stream order with no host sync, the CUDA stream protocol, back-to-back
stress, CUDA graph capture, torch tensors, invalid arguments and host memory beside device memory.
Collective: run under MPI with the other GPU tests (`mpirun -n 2 python -m pytest tests/gpu`), one node or
emulated nodes (HPCCL_NODE_ID=split:K)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hpccl.errors import HpcclInvalidArgument, HpcclUnsupported
from hpccl.ops import AVG, MAX, SUM

from gpu_util import assert_close, have_torch, rank_data, reference, to_dev, to_host

QUICK = os.environ.get("HPCCL_TEST_QUICK") == "1"


def test_another_gpu_current(world):
    """A call made while another GPU is current (torch's test suite does this) runs in the communicator's
    GPU context (was CUDA_ERROR_INVALID_HANDLE from cuLaunchKernel) and leaves the caller's GPU current."""
    import cupy
    comm, dev = world
    ndev = cupy.cuda.runtime.getDeviceCount()
    if ndev < 2:
        pytest.skip("needs 2 GPUs visible to the rank (the 2-GPU machine runs it)")
    other = (dev + 1) % ndev
    x = to_dev(np.full(1000, comm.rank + 1, np.float32), dev)
    cupy.cuda.Device(dev).synchronize()
    with cupy.cuda.Device(other):
        comm.all_reduce(x)
        assert cupy.cuda.runtime.getDevice() == other
    np.testing.assert_array_equal(to_host(x), np.full(1000, comm.size * (comm.size + 1) / 2, np.float32))


@pytest.mark.parametrize("nbytes", [1, 4096, 1 << 20, 40 << 20])
def test_send_recv_group(world, nbytes):
    import cupy
    comm, dev = world
    n, r = comm.size, comm.rank
    count = max(1, nbytes // 4)
    right, left = (r + 1) % n, (r - 1) % n
    mine = rank_data("float32", count, r, 8, SUM)
    x = to_dev(mine, dev)
    y = to_dev(np.zeros(count, np.float32), dev)
    side = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.get_current_stream().synchronize()  # inputs were made on the current stream
    with comm.group():   # ring shift, both directions at once, on a stream of the caller's
        comm.send(x, right, stream=side)
        comm.recv(y, left, stream=side)
    side.synchronize()
    np.testing.assert_array_equal(to_host(y), rank_data("float32", count, left, 8, SUM))
    z = to_dev(np.zeros(count, np.float32), dev)
    with comm.group():
        comm.send(x, r)
        comm.recv(z, r)          # to self
    np.testing.assert_array_equal(to_host(z), mine)
    if n >= 2:  # plain send/recv, ordered by rank parity so nothing deadlocks
        if r % 2 == 0 and r + 1 < n:
            comm.send(x, r + 1)
            comm.recv(y, r + 1)
            np.testing.assert_array_equal(to_host(y), rank_data("float32", count, r + 1, 8, SUM))
        elif r % 2 == 1:
            comm.recv(y, r - 1)
            comm.send(x, r - 1)
            np.testing.assert_array_equal(to_host(y), rank_data("float32", count, r - 1, 8, SUM))


def test_group_defers_collectives(world):
    """Device collectives inside group() run at the group's end, as host ones do."""
    import cupy
    comm, dev = world
    n = comm.size
    x = cupy.full(1000, comm.rank + 1.0, dtype=cupy.float32)
    y = cupy.full(1000, -1.0, dtype=cupy.float32)
    with comm.group():
        comm.all_reduce(x, y)
        cupy.cuda.runtime.deviceSynchronize()
        assert float(y[0]) == -1.0, "a collective inside group() ran before the group ended"
    comm.synchronize()
    assert float(y.min()) == float(y.max()) == n * (n + 1) / 2


def test_overlap_is_copied_like_host(world):
    """An input that partially overlaps the output is copied first (host semantics), not refused."""
    import cupy
    comm, dev = world
    n = comm.size
    base = cupy.arange(2000, dtype=cupy.float64) + comm.rank
    host = np.arange(2000, dtype=np.float64)
    comm.all_reduce(base[:1500], base[500:])
    want = sum(host[:1500] + r for r in range(n))
    np.testing.assert_allclose(cupy.asnumpy(base[500:]), want)


def test_stream_order_no_host_sync(world):
    """A kernel writes the input just before each call and reads the output just after, all on the
    caller's stream with no host sync between: 1000 iterations, 0 wrong."""
    import cupy
    comm, dev = world
    n = comm.size
    count = 4099
    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.zeros(count, dtype=cupy.float32)
    y = cupy.zeros(count, dtype=cupy.float32)
    bad = cupy.zeros(1, dtype=cupy.int64)
    cupy.cuda.get_current_stream().synchronize()
    iters = 1000
    with s:
        for i in range(iters):
            x.fill(float(i + comm.rank))                         # written just before
            comm.all_reduce(x, y, stream=s)
            bad += (y != float(n * i + n * (n - 1) // 2)).sum()  # read just after
    s.synchronize()
    assert int(bad[0]) == 0


def test_stream_protocol_object_and_no_external_stream_warning(world):
    """stream= takes an object of the CUDA stream protocol (``__cuda_stream__``): avg all_reduces (their
    scaling is CuPy work put on the caller's stream) and an all_gather on a side stream, results checked after
    that stream is synchronized; no "ExternalStream is deprecated" warning is raised on the way."""
    import warnings
    import cupy
    comm, dev = world
    n = comm.size
    s = cupy.cuda.Stream(non_blocking=True)
    proto = type("CoreStream", (), {"__cuda_stream__": lambda self: (0, s.ptr)})()
    xs = [cupy.full(c, float(comm.rank + 1), dtype=cupy.float32) for c in (5, 4099, 1 << 18)]
    g = cupy.full(7, comm.rank, dtype=cupy.int32)
    cupy.cuda.get_current_stream().synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for x in xs:
            comm.all_reduce(x, op="avg", stream=proto)
        out = comm.all_gather(g, stream=proto)
    s.synchronize()
    comm.synchronize()
    assert not [w for w in seen if "ExternalStream" in str(w.message)], [str(w.message) for w in seen]
    want = (n + 1) / 2
    for x in xs:
        assert float(x.min()) == want and float(x.max()) == want, (x.size, float(x.min()), want)
    assert [int(v) for v in out.reshape(n, 7)[:, 0].get()] == list(range(n))


def test_back_to_back_stress(world):
    """Many collectives without a host sync in between; one check at the end."""
    import cupy
    comm, dev = world
    n = comm.size
    iters = 300 if (QUICK or comm.num_nodes > 1) else 3000
    sizes = [1, 7, 256, 4096, 65536, 200003]
    bufs = [cupy.full(s, comm.rank + 1, dtype=cupy.float32) for s in sizes]
    outs = [cupy.zeros(s, dtype=cupy.float32) for s in sizes]
    for i in range(iters):
        k = i % len(sizes)
        comm.all_reduce(bufs[k], outs[k], MAX if i % 3 else SUM)
        if i % 97 == 0:
            comm.all_gather(bufs[k][:1])
    comm.synchronize()
    tot = n * (n + 1) / 2
    for k, s in enumerate(sizes):
        last = max(i for i in range(iters) if i % len(sizes) == k)
        want = float(n) if last % 3 else tot
        assert float(outs[k].min()) == want and float(outs[k].max()) == want, (s, last)


def test_cuda_graph_capture(world):
    """Captured and replayed (>= 100 replays checked), on one node and, with the network engine's staged
    steps, across nodes too (one rank per node, and hier's node kernels and network steps with several);
    across nodes without the engine (the proxy fallback): refused before anything is enqueued, and the
    communicator stays usable."""
    import cupy
    comm, dev = world
    n = comm.size
    count = 1 << 16
    x = cupy.full(count, comm.rank, dtype=cupy.float32)
    y = cupy.zeros(count, dtype=cupy.float32)
    g_out = cupy.zeros(count * n, dtype=cupy.float32)
    rs_out = cupy.zeros(count // n, dtype=cupy.float32)
    b_out = cupy.zeros(count, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()
    comm.all_reduce(x, y, SUM, stream=s)  # warm-up: first-use allocations happen outside the capture
    comm.all_gather(x, g_out, stream=s)
    s.synchronize()
    if comm.num_nodes > 1 and not comm._net_capturable():
        with s:
            s.begin_capture()
            try:
                with pytest.raises(HpcclUnsupported, match="CUDA graph"):
                    comm.all_reduce(x, y, SUM, stream=s)
            finally:
                g = s.end_capture()
        del g
        comm.all_reduce(x, y, SUM, stream=s)  # the communicator is still usable
        s.synchronize()
        assert float(y.max()) == n * (n - 1) / 2
        return
    comm.reduce_scatter(x, rs_out, SUM, stream=s)
    comm.broadcast(x, n - 1, recvbuf=b_out, stream=s)
    comm.barrier(stream=s)  # establishes the stream order before the capture
    s.synchronize()
    with s:
        s.begin_capture()
        for _ in range(4):
            x += 1
            comm.all_reduce(x, y, SUM, stream=s)
        comm.all_gather(x, g_out, stream=s)
        comm.reduce_scatter(x, rs_out, SUM, stream=s)
        comm.broadcast(x, n - 1, recvbuf=b_out, stream=s)
        g = s.end_capture()
    replays = 100
    for i in range(replays):
        g.launch(s)
        if i % 25 == 0:  # the output of replay i, while later replays are still to come
            s.synchronize()
            k = 4 * (i + 1)
            assert float(y.min()) == float(y.max()) == sum(r + k for r in range(n)), i
    s.synchronize()
    k = 4 * replays
    want = sum(r + k for r in range(n))
    assert float(y.min()) == want and float(y.max()) == want
    blocks = g_out.reshape(n, count)
    for r in range(n):
        assert float(blocks[r].min()) == float(blocks[r].max()) == r + k, r
    assert float(rs_out.min()) == float(rs_out.max()) == want
    assert float(b_out.min()) == float(b_out.max()) == n - 1 + k
    comm.synchronize()


def test_torch_tensors(world):
    if not have_torch():
        pytest.skip("torch with CUDA is not available")
    import torch
    comm, dev = world
    n = comm.size
    t = torch.full((1000, 3), float(comm.rank + 1), dtype=torch.bfloat16, device=f"cuda:{dev}")
    comm.all_reduce(t)  # on torch's current stream
    torch.cuda.current_stream().synchronize()
    assert float(t.float().min()) == n * (n + 1) / 2
    side = torch.cuda.Stream()
    u = torch.arange(8, dtype=torch.float32, device=f"cuda:{dev}") * (comm.rank + 1)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        g = comm.all_gather(u, stream=side)
    side.synchronize()
    assert g.shape == (n, 8) and isinstance(g, torch.Tensor)
    for r in range(n):
        assert torch.equal(g[r].cpu(), torch.arange(8, dtype=torch.float32) * (r + 1))
    with pytest.raises(HpcclInvalidArgument, match="sendbuf.*contiguous"):
        comm.all_reduce(torch.zeros((4, 4), device=f"cuda:{dev}").t())


def test_invalid_arguments(world):
    import cupy
    comm, dev = world
    x = cupy.zeros(10, dtype=cupy.float32)
    cases = [
        ("recvbuf", lambda: comm.all_reduce(x, cupy.zeros(11, dtype=cupy.float32))),
        ("recvbuf", lambda: comm.all_reduce(x, cupy.zeros(10, dtype=cupy.float64))),
        ("recvbuf", lambda: comm.all_reduce(x, np.zeros(10, dtype=np.float32))),
        ("sendbuf", lambda: comm.all_reduce(cupy.zeros((4, 4), dtype=cupy.float32)[:, 1])),
        ("op", lambda: comm.all_reduce(cupy.zeros(10, dtype=cupy.int32), None, AVG)),
        ("sendbuf", lambda: comm.all_reduce(cupy.zeros(10, dtype=cupy.complex64))),
        ("stream", lambda: comm.all_reduce(x, stream="nope")),
    ]
    if comm.size > 1:
        cases.append(("sendbuf", lambda: comm.reduce_scatter(cupy.zeros(comm.size * 3 + 1, dtype=cupy.float32))))
    ndev = cupy.cuda.runtime.getDeviceCount()
    if ndev > 1:
        other = (dev + 1) % ndev
        with cupy.cuda.Device(other):
            elsewhere = cupy.zeros(10, dtype=cupy.float32)
            other_stream = cupy.cuda.Stream(non_blocking=True)
        cases.append(("sendbuf", lambda: comm.all_reduce(elsewhere)))
        cases.append(("stream", lambda: comm.all_reduce(x, stream=other_stream)))
    for argument, call in cases:
        with pytest.raises(HpcclInvalidArgument) as info:
            call()
        assert info.value.argument == argument, (argument, str(info.value))
    x.fill(1)
    comm.all_reduce(x)  # still usable: errors were raised before any work
    comm.synchronize()
    assert float(x[0]) == comm.size


def test_host_memory_fallback(world, monkeypatch):
    """No-P2P path (staging in pinned shared host memory), forced with HPCCL_CUDA_TRANSPORT=host."""
    import cupy
    import hpccl
    comm0, dev = world
    if comm0.num_nodes > 1:
        pytest.skip("the pinned-host fallback is the one-node kernel path's; this layout spans nodes")
    monkeypatch.setenv("HPCCL_CUDA_TRANSPORT", "host")
    monkeypatch.setenv("HPCCL_CUDA_BUFFER_SIZE", "4M")
    comm = hpccl.Communicator()
    try:
        n = comm.size
        for count in (5, 100000, 1 << 20):
            data = [rank_data("float32", count, r, 9, SUM) for r in range(n)]
            x = to_dev(data[comm.rank], dev)
            comm.all_reduce(x)
            assert comm._dev.engine.transport == "host"
            assert_close("float32", to_host(x), reference("float32", SUM, data), "host all_reduce")
            g = comm.all_gather(to_dev(data[comm.rank], dev))
            np.testing.assert_array_equal(to_host(g), np.stack(data))
        y = cupy.zeros(1 << 20, dtype=cupy.float32)
        with comm.group():
            comm.send(cupy.full(1 << 20, comm.rank, dtype=cupy.float32), (comm.rank + 1) % n)
            comm.recv(y, (comm.rank - 1) % n)
        assert float(y[0]) == (comm.rank - 1) % n
    finally:
        comm.destroy()
