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
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_pair import engine_pair  # noqa: E402

from hpccl.gpu import netreplay, netstage, netstep, netwatch

ne = pytest.importorskip("hpccl.transport.engine", reason="the network engine (UCX) is not built here")._ne

ADD = 0xADD  # the stand-in "kernel": dst[i] = a[i] + b[i] over float32
FUSED = 0xF05ED  # the stand-in fused step (hp_net_step<float32, sum>): stage, token, wait, add
PIPED = 0x919ED  # the stand-in piped step (hp_net_pipe<float32, sum>): per piece stage, token, wait, add

C_DTOH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
C_HTOD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
C_DTOD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
C_VALUE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
C_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
C_CAPT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
C_REC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
C_WEV = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)


def _reached(addr: int, v: int) -> bool:
    return ((ctypes.c_uint32.from_address(addr).value - v) & 0xFFFFFFFF) < (1 << 31)


class Gpu:
    """One rank's stand-in device: a stream is a thread running enqueued work in order."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.failed: list = []
        self.captures = False
        self.calls = {"launch": 0, "post_words": 0}
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while True:
            f = self.q.get()
            if f is None:
                return
            try:
                f()
            except Exception as exc:  # noqa: BLE001
                self.failed.append(exc)

    def drain(self, seconds: float = 20.0) -> None:
        ev = threading.Event()
        self.q.put(ev.set)
        assert ev.wait(seconds), "the stand-in stream did not drain (a step never ended)"

    def stop(self) -> None:
        self.q.put(None)
        self.t.join(5)

    # the driver as Python's StagedNet calls it (ctypes arguments)
    def capturing(self, stream):
        return self.captures

    def memcpy_dtoh(self, host, dev, n, s):
        h = host.value
        self.q.put(lambda: ctypes.memmove(h, dev, n))
        return 0

    def memcpy_htod(self, dev, host, n, s):
        h = host.value
        self.q.put(lambda: ctypes.memmove(dev, h, n))
        return 0

    def write_value32(self, s, addr, v, flags):
        self.calls["post_words"] += 1
        self.q.put(lambda: setattr(ctypes.c_uint32.from_address(addr), "value", v))
        return 0

    def wait_value32(self, s, addr, v, how):
        def wait():
            end = time.monotonic() + 15
            while not _reached(addr, v):
                if time.monotonic() > end:
                    raise TimeoutError(f"done word never reached {v}")
                time.sleep(0)
        self.q.put(wait)
        return 0

    def host_alloc(self, n: int) -> int:
        b = ctypes.create_string_buffer(n)
        self.__dict__.setdefault("_held", []).append(b)
        return ctypes.addressof(b)

    def host_device_pointer(self, h: int) -> int:
        return h

    def mem_free_host(self, p) -> int:
        return 0

    def add(self, dst: int, a: int, b: int, n: int) -> None:
        self.calls["launch"] += 1

        def run():
            t = ctypes.c_float * n
            out = np.frombuffer(t.from_address(dst), np.float32)
            out[:] = np.frombuffer(t.from_address(a), np.float32) + np.frombuffer(t.from_address(b), np.float32)
        self.q.put(run)

    def fused(self, send, stage, sizes, got, src, out, words, tokval) -> None:
        """The fused step's kernel as the stream runs it (cuda/hpccl_kernels.cu hp_net_step, float32 sum)."""
        self.calls["launch"] += 1

        def run():
            ns, count = sizes & 0xFFFFFFFF, (sizes >> 32) & 0x7FFFFFFF
            ctypes.memmove(stage, send, ns)
            if sizes >> 63:  # captured: the replay clears the done word before arming
                ctypes.c_uint32.from_address(words + 4).value = 0
            ctypes.c_uint32.from_address(words).value = tokval & 0xFFFFFFFF
            end = time.monotonic() + 15
            while not _reached(words + 4, tokval >> 32):
                if time.monotonic() > end:
                    raise TimeoutError(f"done word never reached {tokval >> 32}")
                time.sleep(0)
            t = ctypes.c_float * count
            o = np.frombuffer(t.from_address(out), np.float32)
            o[:] = np.frombuffer(t.from_address(src), np.float32) + np.frombuffer(t.from_address(got), np.float32)
        self.q.put(run)

    def piped(self, send, stage, sizes, got, src, out, words, geom, lanes, tokval) -> None:
        """The piped step's kernel as the stream runs it (hp_net_pipe, float32 sum), its pieces in turn: stage
        piece i, write token t0 + i, wait for lane i mod L's done word to reach v0 + i / L, add piece i."""
        self.calls["launch"] += 1

        def run():
            ns, nr, ps, pr = sizes & 0xFFFFFFFF, sizes >> 32, geom & 0xFFFFFFFF, geom >> 32
            nl, k = lanes & 0xFFFFFFFF, lanes >> 32
            t0, v0 = (tokval - (k - 1)) & 0xFFFFFFFF, tokval >> 32
            for i in range(k):
                if i * ps < ns:
                    ctypes.memmove(stage + i * ps, send + i * ps, min(ps, ns - i * ps))
                ctypes.c_uint32.from_address(words).value = (t0 + i) & 0xFFFFFFFF
                done, val = words + 4 + 4 * (i % nl), (v0 + i // nl) & 0xFFFFFFFF
                end = time.monotonic() + 15
                while not _reached(done, val):
                    if time.monotonic() > end:
                        raise TimeoutError(f"lane {i % nl}'s done word never reached {val}")
                    time.sleep(0)
                if i * pr < nr:
                    o, n = i * pr, min(pr, nr - i * pr) // 4
                    t = ctypes.c_float * n
                    d = np.frombuffer(t.from_address(out + o), np.float32)
                    d[:] = np.frombuffer(t.from_address(src + o), np.float32) + np.frombuffer(
                        t.from_address(got + o), np.float32)
        self.q.put(run)

    def entry_points(self) -> tuple:
        """The same driver for the C replay: callbacks in _netreplay.c's F_* order (kept alive here)."""
        def launch(func, gx, gy, gz, bx, by, bz, shmem, s, params, extra):
            assert func in (ADD, FUSED, PIPED)
            if func == PIPED:
                self.piped(*[ctypes.c_uint64.from_address(params[i]).value for i in range(10)])
                return 0
            if func == FUSED:
                self.fused(*[ctypes.c_uint64.from_address(params[i]).value for i in range(8)])
                return 0
            v = [ctypes.c_uint64.from_address(params[i]).value for i in range(4)]
            self.add(*v)
            return 0

        def capturing(s, st):
            st[0] = int(self.captures)
            return 0
        self._cb = (C_DTOH(lambda h, d, n, s: self.memcpy_dtoh(ctypes.c_void_p(h), d, n, s)),
                    C_HTOD(lambda d, h, n, s: self.memcpy_htod(d, ctypes.c_void_p(h), n, s)),
                    C_DTOD(lambda d, sr, n, s: self.q.put(lambda: ctypes.memmove(d, sr, n)) or 0),
                    C_VALUE(self.write_value32), C_VALUE(self.wait_value32), C_LAUNCH(launch),
                    C_CAPT(capturing), C_REC(lambda ev, s: 0), C_WEV(lambda s, ev, f: 0))
        return tuple(ctypes.cast(c, ctypes.c_void_p).value for c in self._cb)


class Area:
    def __init__(self, nbytes: int) -> None:
        self.buf = np.zeros(nbytes, np.uint8)
        self.host = self.dev = self.buf.ctypes.data
        self.nbytes = nbytes


class Mem:
    rec = None


def _net(engs, gpu: Gpu, slice_bytes: int, area: int = 1 << 20):
    n = object.__new__(netstep.StagedNet)
    n.driver, n.eng, n.gate, n.timeout, n.slice = gpu, engs[0], None, 15.0, slice_bytes
    n.engs = list(engs)
    n.st = netstage.new_state()
    n.rec = None
    n._words = (ctypes.c_uint32 * 16)()
    n.ready_h = n.ready_d = ctypes.addressof(n._words)
    n.dones = [(n.ready_h + 4 + 4 * j,) * 2 for j in range(len(engs))]
    n.done_h = n.done_d = n.dones[0][0]
    n._join_ev = 0
    n.steps = n.fused = n.captured = n.piped = 0
    n.pipe = True
    n._graph, n._gwords, n._gword_next, n._armed = [], None, netstage._WORDS, []
    n.fused_size = 16 << 10
    n.kernel_limit, n.stuck_h, n._cstuck, n._cidx = 7_000_000_000, n.ready_h + 48, {}, None
    area = Area(area)
    n._stage = area
    n.staging = lambda total: area
    return n


def _engines():
    return engine_pair(ne)


@pytest.fixture()
def pair():
    a, b = _engines()
    gpus = [Gpu(), Gpu()]
    yield (a, b), gpus
    for g in gpus:
        g.stop()
    a.close()
    b.close()


@pytest.fixture()
def lanes():
    """Two ranks with two lanes each: lane 0 and lane 1 are separate engine pairs."""
    l0, l1 = _engines(), _engines()
    gpus = [Gpu(), Gpu()]
    yield [(l0[0], l1[0]), (l0[1], l1[1])], gpus
    for g in gpus:
        g.stop()
    for e in (*l0, *l1):
        e.close()


def _all_reduce(net: netstep.StagedNet, gpu: Gpu, me: int, x: np.ndarray, y: np.ndarray, label: str) -> None:
    """Python's path: exchange x with the peer and reduce into y, on stream 1."""
    def consume(addr, r):
        _peer, n, buf, _op, src = r
        gpu.add(buf.ctypes.data, src.ctypes.data, addr, n // 4)
        if net.rec is not None:
            net.rec.launch(ADD, 1, 512, (buf.ctypes.data, src.ctypes.data, addr, n // 4), 1)
    net.step(1, [(1 - me, x.ctypes.data, x.nbytes)], [(1 - me, x.nbytes, y, "sum", x)], label, consume)


def _interleaved(engs, gpus):
    """40 all_reduce calls per rank: rank 0 replays from its second call on, rank 1 runs Python on even
    calls; every result checked on the stream."""
    count = 2600  # 10400 bytes in 4 KiB slices: 3 network steps per call, pipelined
    nets = [_net(e, g, 4096) for e, g in zip(engs, gpus)]
    reps = [netreplay.NetReplays(n, Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    xs = [np.zeros(count, np.float32) for _ in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    wrong: list = []
    key = ("ar", 1)
    for i in range(40):
        for r in range(2):
            g, x, y = gpus[r], xs[r], ys[r]
            g.q.put(lambda x=x, v=(r + 1) * (i + 1): x.fill(v))  # the input, written on the stream
            # rank 0 replays from its second call on; rank 1 runs Python on even calls
            if i > 0 and (r == 0 or i % 2):
                assert reps[r].fire(key, f"all_reduce #{i + 1}") == 0
            else:
                rec = reps[r].start(key, 1) if i == 0 else None
                _all_reduce(nets[r], g, r, x, y, f"all_reduce #{i + 1}")
                reps[r].finish(key, rec, True)
            g.q.put(lambda y=y, i=i: None if np.all(y == 3 * (i + 1)) else wrong.append((i, float(y[0]))))
    for g in gpus:
        g.drain()
        assert not g.failed, g.failed
    assert wrong == []
    assert reps[0].replayed == 39 and reps[1].replayed == 20
    assert gpus[0].calls["launch"] == 3 * 40
    return nets, reps[0]._progs[key]


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


def test_fused_steps_replay_with_their_token_and_done_value_patched(pair):
    """Small steps as one kernel (StagedNet.step_fused): the kernel writes the token, the stream writes
    none; replays patch each call's token and done value into the kernel's last argument. 40 calls, rank 0
    replaying from its second, rank 1 alternating with Python, every result checked."""
    (ea, eb), gpus = pair
    nets = [_net((e,), g, 4096) for e, g in zip((ea, eb), gpus)]
    reps = [netreplay.NetReplays(n, Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    count = 64
    xs = [np.zeros(count, np.float32) for _ in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    wrong: list = []
    key = ("ar", 1)

    def python_call(r: int, label: str) -> None:
        net, g, x, y = nets[r], gpus[r], xs[r], ys[r]
        send, recv = (1 - r, x.ctypes.data, x.nbytes), (1 - r, x.nbytes, y, "sum", x)
        assert net.fusable([send], [recv])

        def launch(ss, rs, tv, words):
            assert words == net.ready_d
            vals = (x.ctypes.data, ss, x.nbytes | (count << 32), rs, x.ctypes.data, y.ctypes.data, words, tv)
            g.fused(*vals)
            return FUSED, 1, 256, vals
        net.step_fused(1, send, recv, label, launch)

    for i in range(40):
        for r in range(2):
            g = gpus[r]
            g.q.put(lambda x=xs[r], v=(r + 1) * (i + 1): x.fill(v))
            if i > 0 and (r == 0 or i % 2):
                assert reps[r].fire(key, f"all_reduce #{i + 1}") == 0
            else:
                rec = reps[r].start(key, 1) if i == 0 else None
                python_call(r, f"all_reduce #{i + 1}")
                reps[r].finish(key, rec, True)
            g.q.put(lambda y=ys[r], i=i: None if np.all(y == 3 * (i + 1)) else wrong.append((i, float(y[0]))))
    for g in gpus:
        g.drain()
        assert not g.failed, g.failed
    assert wrong == []
    assert reps[0].replayed == 39 and reps[1].replayed == 20
    assert reps[0]._progs[key].shape == (3, 1, 2, 1)  # a kernel token, a post, the fused kernel
    for n, g in zip(nets, gpus):
        assert n.st.tok == n.st.val[0] == 40 and g.calls["post_words"] == 0
    assert not nets[0].fusable([(1, 0, 4)] * 2, [])  # two sends
    assert not nets[0].fusable([(1, 0, (16 << 10) + 1)], [])  # above HPCCL_NET_FUSED_SIZE
    nets[0].fused_size = 1 << 20  # a limit above a slice: only what every path sends whole is fused
    assert nets[0].fusable([(1, 0, 4096)], []) and not nets[0].fusable([(1, 0, 4097)], [])
    assert ea.error() is None and eb.error() is None


def test_piped_steps_match_the_sliced_path_and_replay(lanes):
    """Large steps as one kernel walking their pieces (StagedNet.step_piped) over two lanes: 40 calls of 3
    pieces each, rank 0 piped (replayed from its second call), rank 1 alternating the piped kernel with the
    Python sliced path (a stream operation per piece) and with fused small steps in between, so the lanes'
    done values drift apart and the piped step first brings them level; every result checked."""
    engs, gpus = lanes
    nets = [_net(e, g, 4096) for e, g in zip(engs, gpus)]
    reps = [netreplay.NetReplays(n, Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    count = 2600  # 10400 bytes: pieces of 3584, 3584 and 3232 bytes on lanes 0, 1, 0
    xs = [np.zeros(count, np.float32) for _ in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    small = [np.zeros(16, np.float32) for _ in range(4)]
    wrong: list = []
    key = ("ar", 1)

    def piped_call(r: int, label: str) -> None:
        net, g, x, y = nets[r], gpus[r], xs[r], ys[r]
        send, recv = (1 - r, x.ctypes.data, x.nbytes), (1 - r, x.nbytes, y, "sum", x)
        assert net.pipeable([send], [recv])

        def launch(ss, rs, geom, nl, tv, words):
            assert nl == 2 | (3 << 32) and geom == 3584 | (3584 << 32)
            vals = (x.ctypes.data, ss, x.nbytes | (x.nbytes << 32), rs, x.ctypes.data, y.ctypes.data, words, geom,
                    nl, tv)
            g.piped(*vals)
            return PIPED, 3, 512, vals
        net.step_piped(1, send, recv, label, launch)

    def fused_call(r: int, label: str) -> None:  # lane 0 only: its done value moves ahead of lane 1's
        net, g, x, y = nets[r], gpus[r], small[r], small[2 + r]

        def launch(ss, rs, tv, words):
            vals = (x.ctypes.data, ss, x.nbytes | (16 << 32), rs, x.ctypes.data, y.ctypes.data, words, tv)
            g.fused(*vals)
            return FUSED, 1, 256, vals
        net.step_fused(1, (1 - r, x.ctypes.data, x.nbytes), (1 - r, x.nbytes, y, "sum", x), label, launch)

    def one_call(i: int, r: int) -> None:
        g = gpus[r]
        g.q.put(lambda x=xs[r], v=(r + 1) * (i + 1): x.fill(v))
        if r == 0 and i > 0:
            assert reps[0].fire(key, f"all_reduce #{i + 1}") == 0
        elif r == 0 or i % 2:
            rec = reps[r].start(key, 1) if i == 0 else None
            piped_call(r, f"all_reduce #{i + 1}")
            reps[r].finish(key, rec, True)
        else:
            _all_reduce(nets[r], g, r, xs[r], ys[r], f"all_reduce #{i + 1}")
        g.q.put(lambda y=ys[r], i=i: None if np.all(y == 3 * (i + 1)) else wrong.append((i, float(y[0]))))
        if i % 3 == 0:
            fused_call(r, f"all_reduce #{i + 1}b")

    for i in range(40):
        for r in range(2):
            one_call(i, r)
    for g in gpus:
        g.drain()
        assert not g.failed, g.failed
    assert wrong == []
    assert reps[0].replayed == 39
    # a lane sync, the pieces handed over as one batch per lane (A_PIPE: the engines make the pieces'
    # batches), the piped kernel; no message is listed (the engines cut them)
    assert reps[0]._progs[key].shape == (3, 1, 0, 2)
    assert gpus[0].calls["post_words"] == 0 and nets[0].piped == 1
    for n in nets:  # every piece's batch ended; every done word where its lane's counter is
        assert n.st.tok == 3 * 40 + 14 and not n.pending()
        assert [ctypes.c_uint32.from_address(h).value for h, _d in n.dones] == list(n.st.val[:2])
    # once batches have ended, later calls take theirs from the engines' spares (batch_staged): five more
    # rounds, each drained before the next, allocate (almost) none; without reuse each lane-0 engine would
    # allocate 11 and each lane-1 engine 5 (an engine may not have pushed a batch back when the next call
    # asks, hence the slack)
    made = [e.staged_made for pair_ in engs for e in pair_]
    for i in range(40, 45):
        for r in range(2):
            one_call(i, r)
        for g in gpus:
            g.drain()
    more = [e.staged_made - m for m, e in zip(made, (e for pair_ in engs for e in pair_))]
    assert wrong == [] and all(d <= 2 for d in more), (wrong, more)
    assert not nets[0].pipeable([(1, 0, 4)] * 2, [])
    assert all(e.error() is None for pair_ in engs for e in pair_)


def test_captured_fused_steps_arm_their_template_at_every_replay(pair):
    """A small step captured in a graph (StagedNet.capture_fused): the kernel clears the template's done
    word, sets its arm word once the send is staged and waits; the engines post the template at each of
    20 replays (the stand-in replays the captured kernel), every result checked."""
    (ea, eb), gpus = pair
    nets = [_net((e,), g, 4096) for e, g in zip((ea, eb), gpus)]
    count = 64
    xs = [np.zeros(count, np.float32) for _ in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    graphs = []
    for r in range(2):
        net, x, y = nets[r], xs[r], ys[r]
        send, recv = (1 - r, x.ctypes.data, x.nbytes), (1 - r, x.nbytes, y, "sum", x)
        args = []

        def launch(ss, rs, tv, words, captured=False, x=x, y=y, args=args):
            assert captured and tv == 1 | (1 << 32)
            args[:] = [x.ctypes.data, ss, x.nbytes | (count << 32) | (1 << 63), rs, x.ctypes.data, y.ctypes.data,
                       words, tv]
        net.capture_fused(1, send, recv, "all_reduce #1", launch)
        graphs.append(args)
    wrong: list = []
    for i in range(20):
        for r in range(2):
            g = gpus[r]
            g.q.put(lambda x=xs[r], v=(r + 1) * (i + 1): x.fill(v))
            g.fused(*graphs[r])
            g.q.put(lambda y=ys[r], i=i: None if np.all(y == 3 * (i + 1)) else wrong.append((i, float(y[0]))))
    for g in gpus:
        g.drain()
        assert not g.failed, g.failed
    assert wrong == []
    assert all(n.captured == 1 and n.fused == 1 and n.st.tok == 0 for n in nets)
    for n in nets:
        for t in n._graph:
            if hasattr(t, "retire"):
                assert t.state()[1] == 20
                t.retire()
    assert ea.error() is None and eb.error() is None
    # the captured kernel's stuck word (words [4] after its arm word) is one StagedNet.error() reads
    net = nets[0]
    (words, idx), = net._cstuck.values()
    assert len(idx) == 1 and net.error() is None
    words[idx[0]] = 1  # what hp_net_wait writes when a captured step's wait gives up
    assert net.gave_up() and "gave up" in str(net.error())


def test_a_graph_replayed_after_its_communicator_closed_ends_and_is_logged(pair, caplog):
    """Replaying a captured graph after its communicator is destroyed is an error (as with NCCL), but no
    hang and no freed memory: the captured steps' words and staging stay, a thread answers each replay's arm
    word with done := 1 (nothing moves) and the error is logged once per communicator."""
    (ea, eb), gpus = pair
    nets = [_net((e,), g, 4096) for e, g in zip((ea, eb), gpus)]
    count = 64
    xs = [np.full(count, r + 1, np.float32) for r in range(2)]
    ys = [np.zeros(count, np.float32) for _ in range(2)]
    graphs = []
    for r in range(2):
        net, x, y = nets[r], xs[r], ys[r]
        args = []

        def launch(ss, rs, tv, words, captured=False, x=x, y=y, args=args):
            args[:] = [x.ctypes.data, ss, x.nbytes | (count << 32) | (1 << 63), rs, x.ctypes.data, y.ctypes.data,
                       words, tv]
        net.capture_fused(1, (1 - r, x.ctypes.data, x.nbytes), (1 - r, x.nbytes, y, "sum", x), "all_reduce #1",
                          launch)
        graphs.append(args)
    for r in range(2):  # one good replay each
        gpus[r].fused(*graphs[r])
    for g in gpus:
        g.drain()
    assert all(np.all(y == 3) for y in ys)
    kept = len(netstage.ORPHANS._keep)
    for n in nets:
        n._words = n._stage = None  # the stand-ins' own memory
        n._old = []
        n.close()
    assert len(netstage.ORPHANS._keep) == kept + 4  # each captured step's staging and page of words stay
    caplog.set_level("WARNING")
    for _ in range(3):  # the graphs replayed after close: each ends (the stand-in waits at most 15 s)
        for r in range(2):
            gpus[r].fused(*graphs[r])
    for g in gpus:
        g.drain(10)
        assert not g.failed, g.failed
    assert sum("replayed after the communicator was destroyed" in m for m in caplog.messages) == 2
