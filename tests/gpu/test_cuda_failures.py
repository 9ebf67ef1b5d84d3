"""GPU failures and the protocol choice of the network steps: a GPU wait that times out names the ranks that
never launched the call, an abort stops peers' kernels at once, a replayed call or a held engine whose peer
never comes ends at HPCCL_TIMEOUT naming it, and where the GPU may be shared the network steps wait as stream
operations. Collective: run under MPI with the other GPU tests (`mpirun -n 2 python -m pytest tests/gpu`); the
network-step tests need one rank per node (HPCCL_NODE_ID=split:1)."""
from __future__ import annotations

import os
import time

import pytest

from hpccl.errors import HpcclError, HpcclRemoteError, HpcclSystemError, HpcclTimeoutError

from gpu_util import end_together


def _staged_net(comm, what: str):
    """The staged network path (StagedNet) of ``comm`` after its first GPU call, which makes it; skips, saying
    ``what`` needs, where the layout has no such path (it serves one rank per node: HPCCL_NODE_ID=split:1)."""
    import cupy
    comm.all_reduce(cupy.ones(16, dtype=cupy.float32))
    comm.synchronize()
    net = getattr(getattr(comm._dev, "prim", None), "net", None)
    if net is None or comm.local_size != 1:
        pytest.skip(f"{what}, which serves one rank per node (HPCCL_NODE_ID=split:1); this layout has "
                    f"{comm.num_nodes} node(s), {comm.local_size} rank(s) per node")
    return net


@pytest.mark.parametrize("mode", ["auto", "spin", "stream"])
def test_network_steps_wait_as_stream_operations_where_the_gpu_may_be_shared(warm_gpu, monkeypatch, mode):
    """HPCCL_CUDA_SYNC decides the network steps' waits too: where the GPU may be shared (auto under CUDA MPS
    or with several ranks on the GPU, or 'stream') a small and a 4 MiB all_reduce across nodes enqueue no
    spinning kernel (no fused or piped step: a process killed with them in flight would leave a kernel that
    never ends); 'spin' takes the one-kernel steps. Results are checked either way."""
    import cupy
    import hpccl
    from hpccl.gpu.gpu_sync import mps_active
    monkeypatch.setenv("HPCCL_CUDA_SYNC", mode)
    comm = hpccl.Communicator()
    try:
        net = _staged_net(comm, "the network steps' waits are the staged network path's")
        n = comm.size
        shared = mode == "stream" or (mode == "auto" and (mps_active() or net.stream_waits))
        assert net.stream_waits == shared, (mode, net.wait_why)
        fused, piped, steps = net.fused, net.piped, net.steps
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            for count in (24, 1 << 20):  # sizes not called before: the Python path, not a replay
                x = cupy.full(count, comm.rank + 1, dtype=cupy.float32)
                comm.all_reduce(x, stream=s)
                s.synchronize()
                comm.synchronize()
                assert float(x[0]) == float(x[-1]) == n * (n + 1) / 2
        if shared:
            assert net.fused == fused and net.piped == piped and net.steps > steps
            assert "stream operations" in comm._dev.path, comm._dev.path
        else:
            assert net.fused > fused and net.piped > piped
    finally:
        end_together(comm)


def _held_call(comm, net, count: int, hold: float):
    """An all_reduce of ``count`` floats on a stream of its own while rank 0's network engines are held for
    ``hold`` seconds (Engine.hold: fault injection); it must raise, by the call or synchronize(). (Seconds
    until the stream was released, pytest's ExceptionInfo.)"""
    import cupy
    x = cupy.ones(count, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    if comm.rank == 0:
        for e in net.engs:
            e.hold(hold)
    t0 = time.monotonic()
    with pytest.raises(HpcclError) as info:
        comm.all_reduce(x, stream=s)
        comm.synchronize()
    s.synchronize()  # released
    return time.monotonic() - t0, info


@pytest.fixture(scope="module")
def warm_gpu():
    """One GPU call across the world with the default HPCCL_TIMEOUT, before tests that shorten it: a process's
    first GPU call loads hpccl's kernels (on a freshly started machine under MPS that outlasted a 2 s timeout:
    the first such test then timed out in its set-up, not in the step it tests)."""
    import cupy
    import hpccl
    comm = hpccl.Communicator()
    try:
        comm.all_reduce(cupy.ones(16, dtype=cupy.float32))
        comm.synchronize()
    finally:
        end_together(comm)


def test_replayed_call_timeout_names_the_peer(warm_gpu, monkeypatch):
    """Across nodes, a call replayed from C (hpccl/csrc/_netreplay.c) whose peer never comes: the step ends at
    HPCCL_TIMEOUT, synchronize() raises HpcclTimeoutError naming the collective and the missing rank, the
    stream is released, and the next call raises at once instead of replaying."""
    import cupy
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "2")
    comm = hpccl.Communicator()
    try:
        comm.all_reduce(cupy.ones(16, dtype=cupy.float32))  # the GPU side is made at the first GPU call
        comm.synchronize()
        x = cupy.ones(16, dtype=cupy.float32)
        s = cupy.cuda.Stream(non_blocking=True)
        comm.all_reduce(x, stream=s)  # recorded
        reps = comm._dev.replays
        if reps is None:
            pytest.skip("replays serve GPU calls across nodes with one rank per node (HPCCL_NODE_ID=split:1); "
                        f"this layout has {comm.num_nodes} node(s), {comm.local_size} rank(s) per node")
        for _ in range(3):
            comm.all_reduce(x, stream=s)
        comm.synchronize()
        assert reps.replayed >= 3 and float(x[0]) == comm.size ** 4
        if comm.rank == 0:
            t0 = time.monotonic()
            with pytest.raises(HpcclTimeoutError) as info:
                comm.all_reduce(x, stream=s)  # replayed: enqueued, then the step times out
                comm.synchronize()
            s.synchronize()
            assert time.monotonic() - t0 < 20
            missing = info.value.missing
            assert "all_reduce" in str(info.value) and missing and 0 not in missing, str(info.value)
            if comm.size == 2:
                assert missing == [1], str(info.value)
            with pytest.raises(HpcclError):
                comm.all_reduce(x, stream=s)
    finally:
        end_together(comm)


@pytest.mark.parametrize("count,pipe", [(16, "1"), (1 << 20, "1"), (1 << 20, "0")], ids=["fused", "piped", "eager"])
def test_kernel_wait_timeout_when_the_engine_stops(warm_gpu, monkeypatch, count, pipe):
    """The backstops of a stream waiting on a stopped engine: across nodes, a small all_reduce (one fused
    kernel), a 4 MiB one (one piped kernel) or a 4 MiB one on the eager path (HPCCL_NET_PIPE=0: copies and
    stream waits, cuStreamWaitValue32) while rank 0's network engines are held (Engine.hold, fault injection:
    no progress, no timeouts, no done words). A kernel gives up at 2 x HPCCL_TIMEOUT + 5 s = 7 s (hold 13 s);
    the eager path's waits are released by the host's watchdog (hpccl/gpu/netwatch.py) once the engines made
    no round for 2 x HPCCL_TIMEOUT + 10 s = 12 s (hold 17 s). Either way before the engines are let go: the
    stream goes on and synchronize() raises HpcclSystemError saying so; the peers' steps fail too."""
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "1")
    monkeypatch.setenv("HPCCL_NET_PIPE", pipe)
    monkeypatch.setenv("HPCCL_CUDA_SYNC", "spin")  # the spinning kernels even where the GPU is shared
    eager = pipe == "0"
    comm = hpccl.Communicator()
    try:
        net = _staged_net(comm, "the backstops are the staged network path's")
        assert net.kernel_limit == 7_000_000_000
        fused, piped = net.fused, net.piped
        steps = net.steps
        took, info = _held_call(comm, net, count, 17 if eager else 13)
        if eager:
            assert net.steps > steps and net.fused == fused and net.piped == piped
        else:
            assert (net.fused > fused) if count == 16 else (net.piped > piped)
        if comm.rank == 0 and eager:
            assert 11.5 < took < 16.5, took  # the watchdog's limit, not the engines' release, ended the wait
            assert isinstance(info.value, HpcclSystemError) and "made no progress" in str(info.value), \
                str(info.value)
        elif comm.rank == 0:
            assert 6.5 < took < 12.5, took  # the kernel's limit, not the engines' release, ended the wait
            assert isinstance(info.value, HpcclSystemError) and "gave up" in str(info.value), str(info.value)
        else:
            assert took < 16.5, took
    finally:
        end_together(comm)


def test_eager_step_behind_a_held_engine_fails_once_let_go(warm_gpu, monkeypatch):
    """The eager path (HPCCL_NET_PIPE=0: copies and cuStreamWaitValue32 waits, no kernel limit) across nodes,
    4 MiB sent by UCX's rendezvous, while rank 0's engines are held for 3 s (HPCCL_TIMEOUT 1 s): rank 1's step
    times out with its sends still held by UCX (a send cannot be cancelled) and answers its stream at once;
    rank 0's, once let go, ends within its own timeout though its sends to rank 1 can never complete. Both
    streams go on and synchronize() raises. Before the engine released such steps rank 0's stream stayed
    blocked for good (docs/perf/issue33/backstop/eager_hang/)."""
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "1")
    monkeypatch.setenv("HPCCL_NET_PIPE", "0")
    comm = hpccl.Communicator()
    try:
        net = _staged_net(comm, "the eager network path is the staged one's")
        steps, piped = net.steps, net.piped
        took, info = _held_call(comm, net, 1 << 20, 3)
        assert net.steps > steps and net.piped == piped
        if comm.rank == 0:
            assert 2.9 < took < 8, took  # ended once let go, within its own timeout
        else:
            assert took < 2.9, took  # answered at its timeout, not when rank 0 was let go
        assert "timed out" in str(info.value) or "aborted" in str(info.value), str(info.value)
    finally:
        end_together(comm)


def test_timeout_is_reported(warm_gpu, monkeypatch):
    """A rank that never arrives: HpcclTimeoutError within a bound, naming the collective, and the
    caller's stream is released (nothing left spinning or waiting forever)."""
    import cupy
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "2")
    monkeypatch.setenv("HPCCL_CUDA_BUFFER_SIZE", "4M")
    comm = hpccl.Communicator()
    if comm.size < 2:
        comm.destroy()
        pytest.skip("needs 2 ranks")
    try:
        warm = cupy.ones(16, dtype=cupy.float32)
        comm.all_reduce(warm)  # every rank: the GPU side and any sub-communicators exist after this
        comm.synchronize()
        if comm.rank == 0:
            s = cupy.cuda.Stream(non_blocking=True)
            t0 = time.monotonic()
            with pytest.raises(HpcclTimeoutError) as info:
                # GPU kernels and asynchronous network steps report at synchronize(); a network step
                # that completes inside the call (the default) reports from the call
                comm.all_reduce(cupy.ones(16, dtype=cupy.float32), stream=s)
                comm.synchronize()
            s.synchronize()  # released: returns
            took = time.monotonic() - t0
            assert took < 20, took
            assert "all_reduce" in str(info.value)
            if comm.num_nodes > 1:  # the network step names who never came (ranks of this communicator)
                peer = comm.nodes.ranks_on(1)[0]
                assert info.value.missing == [peer], str(info.value)
            elif comm.local_size > 1 and not os.environ.get("HPCCL_TRANSPORT"):
                # one node: the peers' published launch counts name every rank that never launched it
                assert info.value.missing == list(range(1, comm.size)), str(info.value)
    finally:
        end_together(comm)


def test_rank_that_stops_launching_is_named(warm_gpu, monkeypatch):
    """Issue 11: in a loop of GPU all_reduces the last rank stops launching (sleeps) at iteration 5; the
    others' kernels time out and the error names it (its published launch count is behind), within a
    bound, and their streams are released."""
    import cupy
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "2")
    comm = hpccl.Communicator()
    if comm.size < 2 or comm.num_nodes > 1 or comm.local_size < 2:
        comm.destroy()
        pytest.skip("needs 2 or more ranks on one node (the launch counts live in shared memory)")
    n, r = comm.size, comm.rank
    try:
        x = cupy.ones(1 << 12, dtype=cupy.float32)
        t0 = time.monotonic()
        err = None
        try:
            for i in range(50):
                if r == n - 1 and i == 5:
                    time.sleep(6)  # stops launching
                    break
                comm.all_reduce(x)
            comm.synchronize()
        except (HpcclTimeoutError, HpcclRemoteError) as exc:
            err = exc
        if r != n - 1:
            # the first rank to time out names it; a rank whose kernel that rank's abort stopped first
            # names it too (HpcclRemoteError: who aborted, and who never launched the call)
            named = err.missing if isinstance(err, HpcclTimeoutError) else err.awaited
            assert err is not None and named == [n - 1], err
            assert time.monotonic() - t0 < 15
            cupy.cuda.get_current_stream().synchronize()  # released
    finally:
        end_together(comm)


def test_abort_stops_peer_kernels_at_once(monkeypatch):
    """Issue 11: a rank that aborts (revoke) while its peers' kernels spin waiting for it: their kernels
    exit within 100 ms through the shared GPU error word (not at HPCCL_TIMEOUT, 30 s here), and the error
    names the rank that aborted."""
    import cupy
    import hpccl
    monkeypatch.setenv("HPCCL_TIMEOUT", "30")
    comm = hpccl.Communicator()
    if comm.size < 2 or comm.num_nodes > 1 or comm.local_size < 2:
        comm.destroy()
        pytest.skip("needs 2 or more ranks on one node (the abort word lives in shared memory)")
    n, r, world = comm.size, comm.rank, comm.mpi_comm
    try:
        x = cupy.ones(1 << 12, dtype=cupy.float32)
        for _ in range(3):
            comm.all_reduce(x)
        comm.synchronize()
        if not os.environ.get("HPCCL_TRANSPORT"):
            assert comm._dev.engine.abort_word == "shared"
        t_abort = t_exit = 0.0
        err = None
        if r == n - 1:
            time.sleep(1.0)  # the peers' kernels are spinning on this rank by now
            t_abort = time.time()
            comm.revoke()
        else:
            comm.all_reduce(x)
            cupy.cuda.get_current_stream().synchronize()  # returns when the kernel exits
            t_exit = time.time()
            try:
                comm.synchronize()
            except HpcclRemoteError as exc:
                err = exc
        t_abort = max(world.allgather(t_abort))
        if r != n - 1:
            assert err is not None and err.rank == n - 1 and "all_reduce" in str(err), err
            assert t_exit - t_abort < 0.1, f"kernel exited {t_exit - t_abort:.3f} s after the abort"
            print(f"rank {r}: kernel exited {1e3 * (t_exit - t_abort):.2f} ms after rank {n - 1}'s abort")
    finally:
        end_together(comm)
