"""Registered GPU buffers (comm.register, issue 12): the zero-copy kernels and the copy-engine path give
the staged kernels' results bitwise, in and out of place, on parts of a registration, under graph capture,
with torch's caching allocator; and every misuse raises a named error before anything is corrupted.

Collective: run under MPI with the other GPU tests (one node only: registration serves the kernels)."""
from __future__ import annotations

import numpy as np
import pytest

from hpccl.errors import HpcclInvalidArgument, HpcclInvalidUsage, HpcclRemoteError, HpcclUnsupported
from hpccl.ops import AVG, MAX, MIN, PROD, SUM

from gpu_util import end_together, FLOATS, assert_close, have_torch, np_dtype, poison, rank_data, reference, to_dev, to_host


@pytest.fixture(scope="module")
def reg():
    """A communicator on spinning kernels: the zero-copy kernels are that protocol's (the stream-synchronised
    one, taken where the GPU may be shared, stages registered buffers like others:
    test_registered_buffers_are_staged_on_a_shared_gpu)."""
    import os

    import cupy
    import hpccl
    from hpccl.gpu.device import rank_device
    old = os.environ.get("HPCCL_CUDA_SYNC")
    os.environ["HPCCL_CUDA_SYNC"] = "spin"
    try:
        comm = hpccl.Communicator()
        comm.all_reduce(cupy.ones(4, dtype=cupy.float32))  # the GPU side exists, spinning
    finally:
        if old is None:
            del os.environ["HPCCL_CUDA_SYNC"]
        else:
            os.environ["HPCCL_CUDA_SYNC"] = old
    dev = rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(dev).use()
    if comm.num_nodes > 1:
        comm.destroy()
        pytest.skip("registration serves the single-node kernels; this layout spans nodes")
    comm.synchronize()
    eng = comm._dev.engine
    eng.zero_copy_min, eng.ce_min = 0, 0  # every size on the zero-copy kernels unless a test says
    yield comm, dev, eng
    comm.synchronize()
    comm.destroy()


def last_algo(comm):
    return comm._rec.calls()[-1]["algorithm"]


def registered(comm, arr):
    comm.register(arr)
    return arr


def test_all_reduce_zero_copy(reg):
    """Every dtype x op on registered buffers: out of place (input and output registered) and in place,
    odd counts; equal to the reference and bitwise equal to the staged kernel's result."""
    import cupy
    comm, dev, eng = reg
    for name in ("int8", "int32", "uint64", "float16", "bfloat16", "float32", "float64"):
        for op in (SUM, PROD, MIN, MAX, AVG):
            if op is AVG and name not in FLOATS:
                continue
            for count in (1, 13, 4099, 300001):
                data = [rank_data(name, count, r, 11, op) for r in range(comm.size)]
                want = reference(name, op, data)
                x = registered(comm, to_dev(data[comm.rank], dev))
                y = registered(comm, to_dev(np.zeros(count, np_dtype(name)), dev))
                poison(y)
                comm.all_reduce(x, y, op)
                assert last_algo(comm) == "zerocopy"
                got = to_host(y)
                assert_close(name, got, want, f"zero-copy {name} {op.value} n={count}")
                staged = comm.all_reduce(to_dev(data[comm.rank], dev), None, op)  # not registered
                assert last_algo(comm) != "zerocopy"
                np.testing.assert_array_equal(got.view(np.uint8), to_host(staged).view(np.uint8))
                comm.all_reduce(x, None, op)  # in place
                assert_close(name, to_host(x), want, f"zero-copy {name} {op.value} n={count} in place")
                comm.deregister(x)
                comm.deregister(y)
    cupy.cuda.runtime.deviceSynchronize()


def test_copy_collectives_zero_copy_and_copy_engine(reg):
    """all_gather, broadcast (every root) and all_to_all on registered buffers, through the zero-copy
    kernel and (broadcast, all_gather) through the copy engines, in and out of place."""
    comm, dev, eng = reg
    n = comm.size
    for ce in (False, True):
        eng.ce_min = 1 if ce else 0
        for count in (1, 4097, 1 << 18):
            data = [rank_data("float32", count, r, 12, SUM) for r in range(n)]
            x = registered(comm, to_dev(data[comm.rank], dev))
            y = registered(comm, to_dev(np.zeros(n * count, np.float32), dev))
            poison(y)
            comm.all_gather(x, y)
            assert last_algo(comm) == ("ce" if ce else "zerocopy")
            np.testing.assert_array_equal(to_host(y), np.concatenate(data))
            poison(y)
            y[comm.rank * count:(comm.rank + 1) * count] = x
            comm.all_gather(y[comm.rank * count:(comm.rank + 1) * count], y)  # in place
            np.testing.assert_array_equal(to_host(y), np.concatenate(data))
            for root in range(n):
                b = to_dev(data[root] if comm.rank == root else np.zeros(count, np.float32), dev)
                comm.register(b)
                comm.broadcast(b, root)
                assert last_algo(comm) == ("ce" if ce else "zerocopy")
                np.testing.assert_array_equal(to_host(b), data[root], err_msg=f"broadcast root {root}")
                out = registered(comm, to_dev(np.zeros(count, np.float32), dev))
                comm.broadcast(b, root, recvbuf=out)
                np.testing.assert_array_equal(to_host(out), data[root])
                comm.deregister(b)
                comm.deregister(out)
            comm.deregister(x)
            comm.deregister(y)
    eng.ce_min = 0
    for count in (1, 1000, 1 << 16):
        data = [rank_data("int32", count * n, r, 13, SUM) for r in range(n)]
        want = np.concatenate([data[s][comm.rank * count:(comm.rank + 1) * count] for s in range(n)])
        x = registered(comm, to_dev(data[comm.rank], dev))
        y = comm.all_to_all(x, to_dev(np.zeros(count * n, np.int32), dev))  # output need not be registered
        assert last_algo(comm) == "zerocopy"
        np.testing.assert_array_equal(to_host(y), want)
        comm.deregister(x)


def test_reduce_and_reduce_scatter_zero_copy(reg):
    comm, dev, eng = reg
    n = comm.size
    for name, op in (("int64", SUM), ("bfloat16", MAX), ("float32", AVG)):
        for count in (3, 70001):
            data = [rank_data(name, count * n, r, 14, op) for r in range(n)]
            want = reference(name, op, data)
            x = registered(comm, to_dev(data[comm.rank], dev))
            y = comm.reduce_scatter(x, None, op)
            assert last_algo(comm) == "zerocopy"
            assert_close(name, to_host(y), want[comm.rank * count:(comm.rank + 1) * count], f"rs {name}")
            for root in range(n):
                out = to_dev(np.zeros(count * n, np_dtype(name)), dev)
                comm.reduce(x, out, root, op)
                assert last_algo(comm) == "zerocopy"
                if comm.rank == root:
                    assert_close(name, to_host(out), want, f"reduce {name} root {root}")
            np.testing.assert_array_equal(to_host(x).view(np.uint8), data[comm.rank].view(np.uint8))
            comm.reduce_scatter(x, x[comm.rank * count:(comm.rank + 1) * count], op)  # in place
            assert_close(name, to_host(x)[comm.rank * count:(comm.rank + 1) * count],
                         want[comm.rank * count:(comm.rank + 1) * count], f"rs in place {name}")
            comm.deregister(x)


def test_parts_of_a_registration_and_threshold(reg):
    """Calls on any contiguous part of a registered buffer (the same part on every rank) are zero-copy;
    below HPCCL_CUDA_ZERO_COPY they take the staged kernels; after deregister, the staged kernels."""
    import cupy
    comm, dev, eng = reg
    big = registered(comm, cupy.zeros(1 << 20, dtype=cupy.float32))
    part = big[1000:1000 + 5000]
    part.fill(comm.rank + 1)
    comm.all_reduce(part)
    assert last_algo(comm) == "zerocopy"
    assert float(part.min()) == float(part.max()) == comm.size * (comm.size + 1) / 2
    assert float(big[999]) == 0.0 and float(big[6000]) == 0.0  # nothing outside the part was written
    eng.zero_copy_min = 1 << 30
    comm.all_reduce(part)
    assert last_algo(comm) != "zerocopy"
    eng.zero_copy_min = 0
    comm.deregister(big)
    comm.all_reduce(part)
    assert last_algo(comm) != "zerocopy"
    comm.synchronize()


def test_graph_capture_of_zero_copy(reg):
    import cupy
    comm, dev, eng = reg
    n = comm.size
    x = registered(comm, cupy.full(1 << 16, comm.rank, dtype=cupy.float32))
    y = registered(comm, cupy.zeros(1 << 16, dtype=cupy.float32))
    s = cupy.cuda.Stream(non_blocking=True)
    comm.barrier(stream=s)
    s.synchronize()
    with s:
        s.begin_capture()
        for _ in range(3):
            x += 1
            comm.all_reduce(x, y, SUM, stream=s)
        g = s.end_capture()
    for _ in range(20):
        g.launch(s)
    s.synchronize()
    want = sum(r + 60 for r in range(n))
    assert float(y.min()) == want and float(y.max()) == want
    comm.deregister(x)
    comm.deregister(y)


def test_torch_caching_allocator(reg):
    if not have_torch():
        pytest.skip("torch with CUDA is not available")
    import torch
    comm, dev, eng = reg
    t = torch.full((4096, 3), float(comm.rank + 1), dtype=torch.bfloat16, device=f"cuda:{dev}")
    comm.register(t)  # a block inside one of the caching allocator's segments
    comm.all_reduce(t)
    assert last_algo(comm) == "zerocopy"
    torch.cuda.current_stream().synchronize()
    assert float(t.float().min()) == float(t.float().max()) == comm.size * (comm.size + 1) / 2
    comm.deregister(t)


def test_register_bad_input(reg):
    """Host memory, strided views, empty buffers, registering twice or overlapping, deregistering what was
    never registered: named errors on every rank, and the communicator keeps working."""
    import cupy
    comm, dev, eng = reg
    with pytest.raises(HpcclInvalidArgument) as info:
        comm.register(np.zeros(10, np.float32))
    assert info.value.argument == "buf" and "host memory" in str(info.value)
    with pytest.raises(HpcclInvalidArgument) as info:
        comm.register(cupy.zeros((8, 8), dtype=cupy.float32)[:, 1])
    assert info.value.argument == "buf" and "contiguous" in str(info.value)
    with pytest.raises(HpcclInvalidArgument, match="empty"):
        comm.register(cupy.zeros(0, dtype=cupy.float32))
    x = registered(comm, cupy.zeros(1000, dtype=cupy.float32))
    with pytest.raises(HpcclInvalidUsage, match="already registered"):
        comm.register(x)
    with pytest.raises(HpcclInvalidUsage, match="already registered"):
        comm.register(x[100:200])  # overlaps
    with pytest.raises(HpcclInvalidUsage, match="not a registered buffer"):
        comm.deregister(x[100:200])
    comm.deregister(x)
    with pytest.raises(HpcclInvalidUsage, match="not a registered buffer"):
        comm.deregister(x)
    # one rank's bad buffer (rank 0 registers z again): every rank raises, the others naming rank 0, and
    # nothing is registered anywhere (y can be registered afterwards)
    y = cupy.zeros(1000, dtype=cupy.float32)
    z = registered(comm, cupy.zeros(10, dtype=cupy.float32))
    with pytest.raises(HpcclInvalidUsage) as info:
        comm.register(z if comm.rank == 0 else y)
    if comm.rank != 0:
        assert "rank(s) [0]" in str(info.value), str(info.value)
    comm.register(y)
    comm.deregister(y)
    comm.deregister(z)
    y.fill(1)
    comm.all_reduce(y)  # still usable
    comm.synchronize()
    assert float(y[0]) == comm.size


def _fresh(monkeypatch):
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "5")
    monkeypatch.setenv("HPCCL_CUDA_ZERO_COPY", "0")
    monkeypatch.setenv("HPCCL_CUDA_BUFFER_SIZE", "4M")
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "spin")
    return hpccl.Communicator()


def test_registered_buffers_are_staged_on_a_shared_gpu(monkeypatch):
    """On the stream-synchronised protocol registered buffers take the staged route (the zero-copy kernels
    spin), with the same results; ranks passing different parts of a registration then need not agree."""
    import cupy
    import hpccl
    monkeypatch.setenv("HPCCL_CUDA_ZERO_COPY", "0")
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "stream")
    comm = hpccl.Communicator()
    try:
        if comm.num_nodes > 1:
            pytest.skip("registration serves the single-node kernels; this layout spans nodes")
        n, me = comm.size, comm.rank
        big = cupy.zeros(2 << 16, dtype=cupy.float32)
        comm.register(big)
        data = [rank_data("float32", 1 << 16, r, 77, SUM) for r in range(n)]
        part = big[:1 << 16] if me % 2 == 0 else big[1 << 16:]
        part[:] = to_dev(data[me], part.device.id)
        cupy.cuda.get_current_stream().synchronize()
        comm.all_reduce(part)
        comm.synchronize()
        assert comm._dev.engine.safe
        assert last_algo(comm) != "zerocopy"
        assert_close("float32", to_host(part), reference("float32", SUM, data), "all_reduce on a registration")
    finally:
        end_together(comm)




def test_register_after_destroy(monkeypatch):
    import cupy
    comm = _fresh(monkeypatch)
    x = cupy.zeros(10, dtype=cupy.float32)
    comm.all_reduce(x)
    comm.destroy()
    with pytest.raises(HpcclInvalidUsage, match="destroyed"):
        comm.register(x)


def test_asymmetric_use_is_named(monkeypatch):
    """Ranks calling on different parts of a registration: every rank's kernel sees the descriptors differ
    at its entry step and ends; the error says so (or, on a rank the other's abort reached first, names
    that rank). Nothing is read from the wrong place."""
    import cupy
    comm = _fresh(monkeypatch)
    if comm.size < 2 or comm.num_nodes > 1:
        end_together(comm)
        pytest.skip("needs 2 ranks on one node")
    try:
        big = cupy.zeros(2 << 16, dtype=cupy.float32)
        comm.register(big)
        part = big[:1 << 16] if comm.rank == 0 else big[1 << 16:]
        with pytest.raises((HpcclInvalidUsage, HpcclRemoteError)) as info:
            comm.all_reduce(part)
            comm.synchronize()
        assert "registered buffers that differ" in str(info.value) or "rank" in str(info.value), str(info.value)
    finally:
        end_together(comm)


def test_freed_after_registration_is_named(monkeypatch):
    """Rank 0 frees a registered allocation, then calls on it: it raises before launching, and the peers
    hear of it (their kernels are stopped, their error names rank 0)."""
    import cupy
    comm = _fresh(monkeypatch)
    if comm.size < 2 or comm.num_nodes > 1:
        end_together(comm)
        pytest.skip("needs 2 ranks on one node")
    rt = cupy.cuda.runtime
    nbytes = 1 << 20
    p = rt.malloc(nbytes)
    mem = cupy.cuda.UnownedMemory(p, nbytes, None)
    x = cupy.ndarray((nbytes // 4,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
    try:
        x.fill(1)
        comm.register(x)
        comm.synchronize()
        comm.mpi_comm.Barrier()
        if comm.rank == 0:
            rt.free(p)
            with pytest.raises(HpcclInvalidUsage, match="freed after comm.register"):
                comm.all_reduce(x)
        else:
            with pytest.raises((HpcclRemoteError, HpcclUnsupported, HpcclInvalidUsage)) as info:
                comm.all_reduce(x)
                comm.synchronize()
            assert "0" in str(info.value), str(info.value)
    finally:
        end_together(comm)
        if comm.rank != 0:
            rt.free(p)
