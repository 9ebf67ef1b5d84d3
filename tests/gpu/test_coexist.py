"""GPU collectives beside other GPU work: they stay correct and finish (slower is fine, stuck is not) while
another process's kernels hold most of the GPU (tests/scripts/gpu_hog.py; under MPS they really run at
once), and while the job's own compute kernels run on other streams (DDP's overlap pattern). Also the
launch bound that makes that possible: no rank's kernel needs more blocks than its share of the GPU."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from hpccl.gpu.cuda_comm import block_cap
from hpccl.ops import MAX, SUM

from gpu_util import assert_close, rank_data, reference, to_dev, to_host

HOG = os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu_hog.py")
SIZES = (1, 4099, 65536 + 3, (1 << 20) + 5)


@pytest.fixture(scope="module")
def world():
    import cupy
    import hpccl
    from hpccl.gpu.device import rank_device
    comm = hpccl.Communicator()
    dev = rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(dev).use()
    yield comm, dev
    comm.synchronize()
    comm.destroy()


def _engine(comm):
    """The node kernel engine: this communicator's, or (several nodes) its node sub-communicator's."""
    if comm._dev is not None and comm._dev.engine is not None:
        return comm._dev.engine
    intra = comm._sub.get("intra")
    return _engine(intra) if intra is not None else None


def test_kernels_fit_their_share_of_the_gpu(world):
    """Every rank's blocks can be resident at once: blocks x ranks per GPU <= SMs, for collectives and
    for a p2p kernel with one send and one receive per peer, whatever HPCCL_CUDA_BLOCKS asks."""
    import cupy
    comm, dev = world
    with forced_hier(comm):  # the node engine is built at the first GPU call (on several nodes: hier's)
        comm.all_reduce(cupy.ones(comm.size * 4, cupy.float32))
    comm.synchronize()
    eng = _engine(comm)
    if eng is None:
        pytest.skip("no node kernels on this layout (one rank per node: network steps only)")
    # on several nodes, every rank of the parent on this GPU counts (hier's node steps of all "nodes"
    # sharing one GPU run at once)
    import collections
    import socket
    gpus = comm.mpi_comm.allgather((socket.gethostname(), cupy.cuda.Device(dev).pci_bus_id))
    assert eng.share == max(collections.Counter(gpus).values()), (eng.share, gpus)
    share, sms = eng.share, eng.peers.sms
    assert eng.block_cap == block_cap(sms, share)
    assert eng.maxb * share <= max(sms, share)
    m = eng.size  # the engine's own communicator (on several nodes: the node's)
    assert 2 * (m - 1) * eng.p2p_blocks * share <= max(sms, 2 * (m - 1) * share)
    before = eng.maxb
    eng.set_blocks(64)
    try:
        assert eng.maxb <= eng.block_cap
    finally:
        eng.set_blocks(before)
    counts = comm.mpi_comm.allgather((eng.maxb, eng.p2p_blocks, eng.safe, eng.safe_blocks))
    assert len(set(counts)) == 1, f"ranks size or synchronise their kernels differently: {counts}"
    # a GPU shared by several ranks (or under MPS) takes the stream-synchronised protocol unless told not to
    from hpccl import config
    if config.get("HPCCL_CUDA_SYNC") == "auto" and share > 1:
        assert eng.safe, eng.sync_why


def _made():
    """Inputs come from CuPy's current stream; order them before a collective on another stream."""
    import cupy
    cupy.cuda.get_current_stream().synchronize()


class forced_hier:
    """On several nodes of several ranks, hier for all_reduce (its node steps run the kernels)."""

    def __init__(self, comm):
        self.comm = comm
        self.on = "hier" in comm.algorithms("all_reduce", "cuda")

    def __enter__(self):
        if self.on:
            self.comm._planner.force("all_reduce", "hier")

    def __exit__(self, *exc):
        if self.on:
            self.comm._planner.force("all_reduce", None)


def _round(comm, dev, seed, stream):
    """One round of the collectives on ``stream``, each checked against numpy."""
    n, me = comm.size, comm.rank
    for count in SIZES:
        for op, name in ((SUM, "float32"), (MAX, "int32")):
            data = [rank_data(name, count, r, seed, op) for r in range(n)]
            x = to_dev(data[me], dev)
            _made()
            y = comm.all_reduce(x, None, op, stream=stream)
            stream.synchronize()
            assert_close(name, to_host(y), reference(name, op, data), f"all_reduce {name} n={count}")
        data = [rank_data("float32", count, r, seed + 1, SUM) for r in range(n)]
        x = to_dev(data[me], dev)
        b = to_dev(data[me], dev)
        r = to_dev(np.zeros(count, np.float32), dev)
        _made()
        out = comm.all_gather(x, stream=stream)
        stream.synchronize()
        assert_close("float32", to_host(out).reshape(-1), np.concatenate(data), f"all_gather n={count}")
        comm.broadcast(b, count % n, stream=stream)
        stream.synchronize()
        assert_close("float32", to_host(b), data[count % n], f"broadcast n={count}")
        with comm.group():
            comm.send(x, (me + 1) % n, stream=stream)
            comm.recv(r, (me - 1) % n, stream=stream)
        stream.synchronize()
        assert_close("float32", to_host(r), data[(me - 1) % n], f"send/recv n={count}")


def _hog_owner(comm, dev):
    """True on the lowest rank of each (host, GPU): that rank starts the GPU's hog."""
    import cupy
    me = (socket.gethostname(), cupy.cuda.Device(dev).pci_bus_id)
    keys = comm.mpi_comm.allgather(me)
    return keys.index(me) == comm.rank


def _start_hog(comm, dev, *args):
    """tests/scripts/gpu_hog.py on the lowest rank of each GPU, once it reports ready (the test fails on every
    rank if it does not); its process, or None on the other ranks."""
    proc, started = None, ""
    if _hog_owner(comm, dev):
        proc = subprocess.Popen([sys.executable, HOG, str(dev), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = proc.stdout.readline()
        if not started.startswith("ready"):
            started = f"rank {comm.rank}: the GPU hog did not start: {started}{proc.stdout.read()}"
    bad = [s for s in comm.mpi_comm.allgather(started) if s and not s.startswith("ready")]
    if bad:
        pytest.fail("; ".join(bad))
    return proc


def test_collectives_beside_another_process(world):
    """Another process keeps ~90% of the GPU's SMs busy with its own kernels for the whole test."""
    import cupy
    comm, dev = world
    proc = _start_hog(comm, dev, "--fraction", "0.9", "--ms", "5")
    try:
        t0 = time.time()
        stream = cupy.cuda.Stream(non_blocking=True)
        for k in range(3):
            _round(comm, dev, 100 + k, stream)
        secs = time.time() - t0
        comm.synchronize()
    finally:
        comm.mpi_comm.Barrier()
        if proc is not None:
            proc.terminate()
            out, _ = proc.communicate(timeout=60)
    if proc is not None:
        assert proc.returncode == 0, out
        done = int(out.split("finished:")[1].split()[0])
        # the hog really ran beside the collectives: 5 ms kernels back to back for the whole test
        assert done >= min(10, int(secs * 1000 / 5) // 2), f"hog finished only {done} kernels in {secs:.1f} s: {out}"
        print(f"[coexist] rank {comm.rank}: collectives took {secs:.2f} s beside the hog; {out.strip()}")


def test_collectives_beside_own_compute_streams(world):
    """The job's own kernels on another stream (compute overlapping communication, as in DDP): a spin
    kernel holding most SMs and a matrix product, launched before every collective and never waited for."""
    import cupy
    comm, dev = world
    sms = cupy.cuda.Device(dev).attributes["MultiProcessorCount"]
    spin = cupy.RawKernel(r"""
    extern "C" __global__ void spin(unsigned long long ns) {
      unsigned long long t0, t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    }""", "spin")
    compute = cupy.cuda.Stream(non_blocking=True)
    comm_stream = cupy.cuda.Stream(non_blocking=True)
    a = cupy.full((512, 512), 1.0 / 512, cupy.float32)
    acc = cupy.zeros((512, 512), cupy.float32)
    n, me = comm.size, comm.rank
    launched = 0
    for it in range(20):
        with compute:
            spin((max(1, int(1.8 * sms)),), (1024,), (cupy.uint64(2_000_000),))
            acc += a @ a
            launched += 1
        count = SIZES[it % len(SIZES)]
        data = [rank_data("float32", count, r, 300 + it, SUM) for r in range(n)]
        x = to_dev(data[me], dev)
        _made()
        comm.all_reduce(x, None, SUM, stream=comm_stream)
        comm_stream.synchronize()
        assert_close("float32", to_host(x), reference("float32", SUM, data), f"all_reduce #{it} n={count}")
    compute.synchronize()
    comm.synchronize()
    # 512x512 of 1/512 squared is 1/512 everywhere; accumulated once per launch
    assert np.allclose(cupy.asnumpy(acc), launched / 512.0, rtol=1e-4)


def _new_comm(comm):
    """A second communicator of the same ranks (its own engine, words and watchdog)."""
    import hpccl
    return hpccl.Communicator(comm.mpi_comm.Dup())


def test_two_communicators_at_once_on_two_streams(world):
    """Two communicators of one job, each on its own stream, with calls in flight on both at once and never
    ordered between them: every result right, nothing stuck (spinning kernels could deadlock here: each
    communicator's resident blocks waiting for the other's peers)."""
    import cupy
    comm, dev = world
    other = _new_comm(comm)
    try:
        n, me = comm.size, comm.rank
        s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        t0 = time.time()
        for it in range(40):
            count = SIZES[it % len(SIZES)]
            d1 = [rank_data("float32", count, r, 500 + it, SUM) for r in range(n)]
            d2 = [rank_data("float32", count, r, 900 + it, SUM) for r in range(n)]
            x1, x2 = to_dev(d1[me], dev), to_dev(d2[me], dev)
            g = to_dev(d2[me], dev)
            _made()
            comm.all_reduce(x1, None, SUM, stream=s1)
            other.all_reduce(x2, None, SUM, stream=s2)
            out = other.all_gather(g, stream=s2)
            comm.all_reduce(x1, None, SUM, stream=s1)
            s1.synchronize()
            s2.synchronize()
            assert_close("float32", to_host(x1), reference("float32", SUM, d1) * n, f"comm 1 #{it} n={count}")
            assert_close("float32", to_host(x2), reference("float32", SUM, d2), f"comm 2 #{it} n={count}")
            assert_close("float32", to_host(out).reshape(-1), np.concatenate(d2), f"comm 2 gather #{it}")
        comm.synchronize()
        other.synchronize()
        print(f"[coexist] rank {me}: 2 communicators x 2 streams, 40 rounds in {time.time() - t0:.2f} s")
    finally:
        other.destroy()


def test_a_kernel_that_never_ends_gives_a_timeout_not_a_hang(world, monkeypatch):
    """Another process's kernel holds every multiprocessor for far longer than HPCCL_TIMEOUT: a collective
    of the stream-synchronised protocol cannot get the GPU, and comm.synchronize() raises HpcclTimeoutError
    within HPCCL_TIMEOUT + 3 s (not when the foreign kernel ends); the output is not written."""
    import cupy
    import hpccl
    comm, dev = world
    monkeypatch.setenv("HPCCL_TIMEOUT", "4")
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "stream")
    sub = _new_comm(comm)
    x = to_dev(np.full(1 << 16, comm.rank + 1, np.float32), dev)
    _made()
    sub.all_reduce(x)  # set up (peer memory, kernels compiled) while the GPU is free
    sub.synchronize()
    x[:] = 7
    _made()
    proc = _start_hog(comm, dev, "--fraction", "1.0", "--ms", "20000", "--once")
    t0 = time.time()
    try:
        stream = cupy.cuda.Stream(non_blocking=True)
        sub.all_reduce(x, stream=stream)
        with pytest.raises(hpccl.HpcclError) as ei:
            sub.synchronize()
        took = time.time() - t0
        print(f"[coexist] rank {comm.rank}: {type(ei.value).__name__} after {took:.1f} s: {ei.value}")
        assert isinstance(ei.value, (hpccl.HpcclTimeoutError, hpccl.HpcclRemoteError)), ei.value
        assert took < 4 + 3, f"raised only after {took:.1f} s"
    finally:
        comm.mpi_comm.Barrier()
        if proc is not None:
            proc.terminate()
            proc.communicate(timeout=60)
        comm.mpi_comm.Barrier()
    stream.synchronize()  # the hog is gone: the queued kernels run, as no-ops
    assert (to_host(x) == 7).all(), "a timed-out collective wrote its output"
    sub.destroy()
