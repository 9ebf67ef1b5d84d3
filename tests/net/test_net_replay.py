"""Recorded GPU network calls replayed from C (hpccl/gpu/netreplay.py, hpccl/csrc/_netreplay.c), on the CPU.

Two real engines in one process talk over UCX (TCP); the CUDA driver is a stand-in whose "streams" are
threads running each rank's enqueued work in order on host memory (copies, the ready and done words, a
reduction "kernel"), so the replay runs exactly as on a GPU: it only enqueues, and the engine posts each
step when the stream writes its token. Checked: a recorded sliced exchange replays with the same
messages as the Python path (a rank that replays and a peer that runs Python always match), results are
right at every iteration, the token and done counters are shared, and what a replay cannot take is
refused."""
from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standin_gpu import Mem, _all_reduce, _interleaved, _net, lanes, pair  # noqa: E402,F401 (fixtures)

from hpccl.gpu import netreplay, netstage, netwatch  # noqa: E402


def test_replay_and_python_path_match_every_call(pair):
    (ea, eb), gpus = pair
    nets, prog = _interleaved([(ea,), (eb,)], gpus)
    # 3 copies in, 3 tokens, 3 batches (a send and a receive each), 3 waits, 3 adds; one lane
    assert prog.shape == (15, 3, 6, 1)
    for n in nets:  # one token and one done value per step, Python's and the replays' on one counter
        assert n.st.tok == n.st.val[0] == 3 * 40
        assert ctypes.c_uint32.from_address(n.done_h).value == 3 * 40
    assert ea.error() is None and eb.error() is None
    nets[0]._words[12] = 1  # a network kernel gave up on the engine: the next call is not replayed
    assert prog.run(1, "all_reduce #41") == 2 and nets[0].st.tok == 3 * 40


def test_a_kernel_that_gave_up_on_the_engine_is_the_next_calls_error(pair):
    """The network kernels' backstop (hp_net_wait): the limit is written where the kernels read it (low word
    first), and a stuck word the kernel set makes StagedNet.error() an HpcclSystemError saying the engine
    stopped, ahead of the engines' own errors."""
    from hpccl.errors import HpcclSystemError
    (ea, _eb), gpus = pair
    net = _net((ea,), gpus[0], 4096)
    netstage._put_limit(net.ready_h + 40, net.kernel_limit)
    assert (net._words[10] | net._words[11] << 32) == 7_000_000_000
    assert net.error() is None
    net._words[12] = 1  # what hp_net_wait writes when it gives up
    err = net.error()
    assert isinstance(err, HpcclSystemError) and "gave up" in str(err) and "7s" in str(err)


@pytest.mark.parametrize("count,slice_bytes", [(2600, 4096), (3 << 18, 1 << 20)], ids=["eager", "rendezvous"])
def test_an_eager_step_behind_a_held_engine_ends_once_it_is_let_go(lanes, count, slice_bytes):
    """The eager path (a stream wait per slice, no limit of its own) on two lanes while rank 0's engines are
    held (Engine.hold) and rank 1's step times out (HPCCL_TIMEOUT 0.5 s here) and its engines are aborted, as
    a failed rank's are: once rank 0's engines are let go, each ends its batches (ok, or failed within its
    timeout) and writes every done word, so rank 0's stream drains. With 1 MiB slices UCX sends by
    rendezvous, and a send whose receiver gave up can never be cancelled: a failed step left with only such
    sends answers its stream at once (``lingering`` counts it until the endpoint closes); before that, the
    GPU run of this case stayed blocked (docs/GPU.md)."""
    engs, gpus = lanes
    nets = [_net(e, g, slice_bytes, area=8 << 20) for e, g in zip(engs, gpus)]
    for n in nets:
        n.timeout = 0.5
    xs = [np.ones(count, np.float32) for _ in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    for e in engs[0]:
        e.hold(3)
    t0 = time.monotonic()
    for r in range(2):
        _all_reduce(nets[r], gpus[r], r, xs[r], ys[r], "all_reduce #1")
    gpus[1].drain(5)  # rank 1: its step timed out, its done words written
    assert any(e.error() is not None for e in engs[1])
    for e in engs[1]:
        e.abort(1)
    assert nets[0].pending() and time.monotonic() - t0 < 3
    gpus[0].drain(10)
    took = time.monotonic() - t0
    assert not gpus[0].failed and not nets[0].pending(), gpus[0].failed
    assert 3 < took < 6, took  # a lane whose peer's messages had all come ends ok, the others fail
    big = slice_bytes > 64 << 10
    # rank 0's sends went out after rank 1 cancelled its receives: held by UCX on the rendezvous path only
    assert (sum(e.lingering for e in engs[0]) > 0) == big
    if big:
        nets[0]._old, nets[0]._join_ev = [], 0
        kept: list = []
        netstage.ORPHANS.keep, keep = kept.extend, netstage.ORPHANS.keep
        try:
            nets[0].close()  # the staging those sends may still read is kept, not freed
        finally:
            netstage.ORPHANS.keep = keep
        assert nets[0]._stage is None and len(kept) == 2  # the words and the staging area
    for e in engs[0]:
        e.close()  # closing the endpoints ends the sends (their batches still alive: no late callback)
        assert e.lingering == 0


def test_the_watchdog_releases_a_stream_waiting_on_a_stopped_engine(pair):
    """hpccl/csrc/_netwatch.c: an eager step's stream wait (cuStreamWaitValue32, no limit of its own) behind an
    engine whose thread stopped (Engine.hold) is released once that engine made no round of its loop for the
    watch's limit (2 x HPCCL_TIMEOUT + 10 s in use; 1 s here): the done word is written, the stream goes on,
    and error() says the watchdog released it. A live, idle engine is never released."""
    from hpccl import _netengine
    from hpccl.errors import HpcclSystemError
    (ea, eb), gpus = pair
    assert netwatch.limit_s(0.5) == 11.0 and netwatch.limit_s(0) == 0.0
    net = _net((ea,), gpus[0], 4096)
    net.timeout = 0.5
    vals = ctypes.addressof(net.st) + type(net.st).val.offset
    live = _net((eb,), gpus[1], 4096)
    watches = [_netengine.NetWatch((n.engs[0],), n.stuck_h, (n.dones[0][0],), vals if n is net else
                                   ctypes.addressof(n.st) + type(n.st).val.offset, 1.0, n.st) for n in (net, live)]
    assert all(w.watching and w.released == 0 for w in watches)
    ea.hold(30)
    time.sleep(0.05)
    b = ea.beats
    time.sleep(0.1)
    assert ea.beats == b and eb.beats > 0  # a held thread makes no round
    x, y = np.ones(1024, np.float32), np.zeros(1024, np.float32)
    t0 = time.monotonic()
    _all_reduce(net, gpus[0], 0, x, y, "all_reduce #1")  # the stream now waits for a done word nobody writes
    assert net.pending() and net.error() is None
    gpus[0].drain(5)  # the stream went on: released
    took = time.monotonic() - t0
    assert not gpus[0].failed, gpus[0].failed
    assert 0.7 < took < 2.0, took  # the limit counts from the engine's last round (0.15 s before t0)
    assert watches[0].released == 1 and not net.pending() and net._words[12] == netwatch.STUCK_WATCH
    err = net.error()
    assert isinstance(err, HpcclSystemError) and "made no progress for 11s" in str(err)
    time.sleep(1.5)
    assert watches[1].released == 0 and live._words[12] == 0  # the live engine, idle all along
    for w in watches:
        w.close()
        assert not w.watching
    ea.hold(0)  # let go, it ends the step it was handed (its peer never answers: HPCCL_TIMEOUT) in net's memory
    end = time.monotonic() + 10
    while ea.error() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert ea.error() is not None
    with pytest.raises(ValueError):
        _netengine.NetWatch((ea,), net.stuck_h, (), vals, 1.0, None)
    with pytest.raises(TypeError):
        _netengine.NetWatch((object(),), net.stuck_h, (net.dones[0][0],), vals, 1.0, None)


def test_closing_behind_a_stopped_engine_keeps_its_memory(pair, monkeypatch):
    """A communicator closed while a step is still behind (its engine stopped: a kernel gave up on it) keeps
    the words and staging that engine may yet write until the process ends (netstage.ORPHANS), where a
    healthy one frees them."""
    (ea, _eb), gpus = pair
    kept: list = []
    monkeypatch.setattr(netstage.ORPHANS, "keep", kept.extend)
    freed: list = []

    class Mem:
        def __init__(self, name: str) -> None:
            self.name = name

        def free(self) -> None:
            freed.append(self.name)
    for behind in (False, True):
        net = _net((ea,), gpus[0], 4096)
        held = net._words  # the done and stuck words live here
        net._words, net._stage, net._old, net._join_ev = Mem("words"), Mem("stage"), [], 0
        net.st.val[0] = 1 if behind else 0  # a step handed out whose done word (0) is behind
        net.close()
        assert (freed, [m.name for m in kept]) == (([], ["words", "stage"]) if behind else (["words", "stage"], []))
        freed.clear()
        kept.clear()
        del held


def test_a_replay_wakes_only_the_lanes_it_handed_work(lanes):
    """A call small enough for one piece goes over lane 0 only; replaying it must not wake the other lanes'
    engines, asleep with nothing to do (it did, a write(2) per idle lane at every call: host time on the
    caller's thread)."""
    engs, gpus = lanes
    count = 512  # 2 KiB: one piece, lane 0
    nets = [_net(e, g, 4096) for e, g in zip(engs, gpus)]
    reps = [netreplay.NetReplays(n, Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    xs = [np.ones(count, np.float32) for _ in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    key = ("ar", 1)
    for r in range(2):
        rec = reps[r].start(key, 1)
        _all_reduce(nets[r], gpus[r], r, xs[r], ys[r], "all_reduce #1")
        reps[r].finish(key, rec, True)
    for g in gpus:
        g.drain()
    time.sleep(0.2)  # the idle lane's engines go to sleep
    idle = [engs[r][1].wakes for r in range(2)]
    for i in range(20):
        for r in range(2):
            assert reps[r].fire(key, f"all_reduce #{i + 2}") == 0
        for g in gpus:
            g.drain()
        time.sleep(0.01)
    assert not any(g.failed for g in gpus) and np.all(ys[0] == 2) and np.all(ys[1] == 2)
    assert [engs[r][1].wakes for r in range(2)] == idle
    assert [n.st.val[1] for n in nets] == [0, 0]  # nothing was handed to lane 1


def test_lanes_carry_alternate_slices(lanes):
    """Two lanes: slice i of every message goes over lane i mod 2 (its own engine, done word and counter),
    on the Python path and in replays alike."""
    engs, gpus = lanes
    nets, prog = _interleaved(engs, gpus)
    assert prog.shape == (15, 3, 6, 2)
    for n in nets:  # slices 0 and 2 on lane 0, slice 1 on lane 1, in each of the 40 calls
        assert n.st.tok == 3 * 40 and list(n.st.val[:2]) == [2 * 40, 40]
        assert [ctypes.c_uint32.from_address(h).value for h, _d in n.dones] == [80, 40]
    assert all(e.error() is None for pair_ in engs for e in pair_)


def test_capture_and_engine_failure_enqueue_nothing(pair):
    (ea, eb), gpus = pair
    count = 256
    nets = [_net((e,), g, 4096) for e, g in zip((ea, eb), gpus)]
    reps = [netreplay.NetReplays(n, Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    xs = [np.full(count, r + 1, np.float32) for r in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    for r in range(2):
        rec = reps[r].start(("k", 1), 1)
        _all_reduce(nets[r], gpus[r], r, xs[r], ys[r], "all_reduce #1")
        reps[r].finish(("k", 1), rec, True)
    for g in gpus:
        g.drain()
    assert np.all(ys[0] == 3) and np.all(ys[1] == 3)
    assert reps[0].fire(("other", 1), "x") == -1  # nothing recorded under that key
    gpus[0].captures = True
    posts = gpus[0].calls["post_words"]
    assert reps[0].fire(("k", 1), "all_reduce #2") == 1 and gpus[0].calls["post_words"] == posts
    gpus[0].captures = False
    ea.abort(0)  # an aborting engine takes no replay: the Python path raises its error
    assert reps[0].fire(("k", 1), "all_reduce #2") == 2 and gpus[0].calls["post_words"] == posts
    assert nets[0].st.tok == 1


def test_a_recording_refuses_what_it_cannot_replay():
    rec = netreplay.Recording(7)
    rec.copy(0, 1, 2, 3, 7)
    rec.token(7)
    rec.post([(0, 1, 100, 8)], 1, 5, 0, 7)
    rec.wait(1, 5, 7)
    assert rec.why is None and rec.acts == [(0, 1, 2, 3), (6, 0), (3, 1, 1), (4, 0)]
    rec.launch(1, 1, 1, tuple(range(11)), 7)
    assert rec.why == "a kernel with more than 10 arguments"
    other = netreplay.Recording(7)
    other.copy(0, 1, 2, 3, 8)
    assert other.why == "work on another stream"
    late = netreplay.Recording(7)
    late.wait(0, 9, 7)
    assert late.why == "a wait for a step of another call"
    gated = netreplay.Recording(7)
    gated.post([], 0, 1, 0, 7)
    gated.post([], 0, 2, 64, 7)
    assert gated.why == "steps with different gates"
