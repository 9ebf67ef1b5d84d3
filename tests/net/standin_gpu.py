"""A stand-in GPU for the network steps on the CPU (tests/net/test_net_replay.py, test_net_fused.py): two real
engines in one process talk over UCX (TCP); the CUDA driver is a stand-in whose "streams" are threads running
each rank's enqueued work in order on host memory (copies, the ready and done words, a reduction "kernel"), so
recorded calls replay exactly as on a GPU. Also the fixtures that make two ranks (pair) or two ranks with two
lanes each (lanes)."""
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

from hpccl.gpu import netreplay, netstage, netstep

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
