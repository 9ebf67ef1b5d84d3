"""Drive hpccl's network engine from several threads, as the library does, for a sanitizer run
(tests/test_sanitizers.py): messages, probes for point-to-point messages from another thread, the compiled path across nodes (NetHot) on two threads, gated steps whose ready words another thread writes, templates
armed from another thread (as a graph replay's stream writes their words) and polled by the engine, recorded calls replayed from C on two
threads (NetProgram; one rank's programs fused steps whose stand-in kernel writes the token, the other's a piped
step whose batch the engine thread cuts) and through the C front door (NetDoor), a failed step released with a send UCX holds, the watchdog's thread
releasing a held engine's words, two engines closing at once with goodbyes, abort, control messages, a dropped
send parked until close, close.

    python engine_drive.py DIR    (DIR holds an _netengine build, e.g. one built with -fsanitize=thread)
"""
import ctypes
import sys
import threading
import time
from pathlib import Path

import numpy as np

import libucx

libucx.load_library()
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "net"))
import _netengine as ne  # noqa: E402
from engine_pair import engine_pair, held_send  # noqa: E402


def until(pred, seconds=10.0):
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(1e-4)
    return pred()


a, b = engine_pair(ne)
x = np.arange(1 << 16, dtype=np.float32)
y = np.zeros_like(x)
for _ in range(200):  # caller-driven and thread-driven progress interleave
    r, s = b.recv(0, y), a.send(1, x)
    assert r.wait(10) and s.wait(10)
assert np.array_equal(x, y)
# receive from any source: a peer's point-to-point message is seen by probe(), from another thread than
# the one that sent it, while the engine thread progresses; a collective's message (no p2p flag) is not
sender = threading.Thread(target=lambda: [a.send(1, x, 0.0, True).wait(10) for _ in range(20)])
sender.start()
for _ in range(20):
    assert until(lambda: b.probe(0))
    r = b.recv(0, y, 0.0, True)
    assert r.wait(10)
sender.join()
assert not b.probe(0)
s = a.send(1, x)  # a collective's message: not a point-to-point one
time.sleep(0.05)
assert not b.probe(0)
r = b.recv(0, y)
assert r.wait(10) and s.wait(10) and np.array_equal(x, y)

def hot_calls(h, rank, out):
    """The compiled path across nodes (NetHot), each rank on its own thread: its caller-driven progress
    against the engine threads; every result checked."""
    def run(rc):
        while rc == 1:
            rc = 0 if h.resume() else 1
        assert rc == 0, rc
    x = np.full(1000, rank + 1, np.float32)
    for i in range(60):
        y = np.empty_like(x)
        run(h.all_reduce(x, y, 0, 2 * i))
        assert np.all(y == 3), y[:4]
        g = np.empty(2 * x.size, np.float32)
        run(h.all_gather(x, g, 2 * i + 1))
        assert np.all(g[:x.size] == 1) and np.all(g[x.size:] == 2)
        bc = x.copy()
        run(h.broadcast(bc, None, i % 2, 2 * i + 1))
        assert np.all(bc == 1 + i % 2)
        run(h.barrier(2 * i + 1))
    out[rank] = h.calls


hots = [ne.NetHot(e, 1 << 16, 1 << 16, 10, lambda *a: RuntimeError(a)) for e in (a, b)]
made = [0, 0]
threads = [threading.Thread(target=hot_calls, args=(hots[r], r, made)) for r in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert made == [240, 240], made
del hots

words = (ctypes.c_uint32 * 4)()
w = [ctypes.addressof(words) + 4 * i for i in range(4)]
for k in range(1, 51):
    a.staged([(ne.SEND, 1, x.ctypes.data, x.nbytes)], w[0], k, w[1], k, 10.0, "step")
    b.staged([(ne.RECV, 0, y.ctypes.data, y.nbytes)], w[2], k, w[3], k, 10.0, "step")

    def ready(k=k):
        words[0] = k
        words[2] = k
    t = threading.Thread(target=ready)
    t.start()
    t.join()
    assert until(lambda: words[1] == k and words[3] == k), k

done = (ctypes.c_uint32 * 4)()  # done a, done b, arm a, arm b: a graph replay clears done, then sets arm
ta = a.template([(ne.SEND, 1, x.ctypes.data, x.nbytes)], ctypes.addressof(done), ctypes.addressof(done) + 8,
                10.0, "captured")
tb = b.template([(ne.RECV, 0, y.ctypes.data, y.nbytes)], ctypes.addressof(done) + 4, ctypes.addressof(done) + 12,
                10.0, "captured")


def arm():
    done[1], done[3], done[0], done[2] = 0, 1, 0, 1


for i in range(50):
    t = threading.Thread(target=arm)
    t.start()
    t.join()
    assert until(lambda: done[0] == 1 and done[1] == 1), i
    ta.state(), a.counters(), b.dead()
ta.retire()
assert a.error() is None and b.error() is None

# recorded GPU calls replayed from C (NetProgram, hpccl/csrc/_netreplay.c), each rank's on a thread of its own as
# callers' threads do, beside the engine threads: a stand-in driver whose "stream" runs at once (word
# writes immediately; a wait spins until the engine wrote the done word; copies do nothing: the data the
# engine moves is checked above)
DTOH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
HTOD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
DTOD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
VALUE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_void_p)
CAPT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
REC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
WEV = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)


def _store(s, addr, v, f):
    ctypes.c_uint32.from_address(addr).value = v
    return 0


def _spin(s, addr, v, f):
    return 0 if until(lambda: ((ctypes.c_uint32.from_address(addr).value - v) & 0xFFFFFFFF) < (1 << 31)) else 1


def _capt(s, st):
    st[0] = 0
    return 0


FUSED = 0xF05ED  # a fused step's kernel (hp_net_step): writes the token, waits for the done word


def _launch(func, gx, gy, gz, bx, by, bz, shmem, s, params, extra):
    if func != FUSED:
        return 0
    p = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    words, tokval = (ctypes.c_uint64.from_address(p[i]).value for i in (6, 7))
    ctypes.c_uint32.from_address(words).value = tokval & 0xFFFFFFFF
    return _spin(s, words + 4, tokval >> 32, 0)


cbs = (DTOH(lambda h, d, n, s: 0), HTOD(lambda d, h, n, s: 0), DTOD(lambda d, sr, n, s: 0), VALUE(_store), VALUE(_spin),
       LAUNCH(_launch), CAPT(_capt), REC(lambda ev, s: 0), WEV(lambda s, ev, f: 0))
fns = tuple(ctypes.cast(c, ctypes.c_void_p).value for c in cbs)
state = [(ctypes.c_uint32 * 16)() for _ in range(2)]  # netstage.NetState's layout: tok, pad, stream(2), join, pad, vals
pw = [(ctypes.c_uint32 * 4)() for _ in range(2)]      # ready word, done word
for st in state:
    st[2] = st[3] = 0xFFFFFFFF
src = [np.full(1 << 16, r + 1, np.uint8) for r in range(2)]
dst = [np.zeros(1 << 16, np.uint8) for _ in range(2)]
progs = []
for r, eng in enumerate((a, b)):
    rw, dw = ctypes.addressof(pw[r]), ctypes.addressof(pw[r]) + 4
    msgs = [(ne.SEND, 1 - r, src[r].ctypes.data, src[r].nbytes), (ne.RECV, 1 - r, dst[r].ctypes.data, dst[r].nbytes)]
    # odd ranks' programs are fused steps: the kernel writes the token (A_KTOKEN) and the replay patches
    # its last argument (A_KLAUNCH); their step is two batches (the send, then the receive, each on a token
    # of its own, as a piped step's pieces), handed to the engine as one chain before the launch; both
    # kinds interleave on one counter with the same messages
    # even ranks' programs are a piped step of one piece (A_PIPE): the replay hands the engine one batch that
    # the engine thread makes the piece's batch of, with the same two messages
    n = src[r].nbytes
    piped = [(9, 1), (10, 1, 1, 1 - r, src[r].ctypes.data, 1, n, n, 1 - r, dst[r].ctypes.data, 1, n, n),
             (8, FUSED, 1, 256, (0, 0, 0, 0, 0, 0, rw, 0), 0)]
    fused = [(7, 0), (3, 1, 0), (7, 0), (3, 1, 0), (8, FUSED, 1, 256, (0, 0, 0, 0, 0, 0, rw, 0), 1)]
    progs.append(eng.program(fused if r else piped, [] if not r else msgs, fns, (rw, rw, 0), ((eng, dw, dw),),
                             ctypes.addressof(state[r]), 0, 10.0, 0, None))
ran = [0, 0]


def replays(r):
    for i in range(40):
        assert progs[r].run(1, f"all_gather #{i}") == 0
        ran[r] += 1


threads = [threading.Thread(target=replays, args=(r,)) for r in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert ran == [40, 40] and all(p.runs == 40 for p in progs), ran
assert [pw[r][1] for r in range(2)] == [40, 80], [pw[r][1] for r in range(2)]  # every replayed batch ended
assert a.error() is None and b.error() is None


class Arr:  # what the C front door reads off a CuPy array
    def __init__(self, a):
        self.a, self.size, self.dtype, self._c_contiguous = a, a.size, a.dtype, True
        self.data = type("Ptr", (), {"ptr": a.ctypes.data})()


class Comm:  # what it reads and writes on a communicator
    _group, _destroyed, _aborted, _seq = None, False, False, 0

    def __init__(self):
        self._waiter = type("W", (), {"collective": "", "seq": 0})()
        self._transports = []


NAMES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")
comms, arrs = [Comm(), Comm()], [Arr(src[r]) for r in range(2)]
doors = [ne.NetDoor(comms[r], Arr, True, None, (), NAMES, RuntimeError) for r in range(2)]
for r in range(2):
    x = arrs[r]
    assert doors[r].put(1, (x.data.ptr, x.size, x.dtype, True), None, "sum", 0, 1, progs[r], x.a.nbytes)


def door_calls(r):  # replays through the door, each rank's caller on its own thread
    for i in range(20):
        assert doors[r].fire(1, arrs[r], None, "sum", 0, 1)
        assert not doors[r].fire(1, arrs[r], None, "max", 0, 1)


threads = [threading.Thread(target=door_calls, args=(r,)) for r in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert [d.fired for d in doors] == [20, 20] and [c._seq for c in comms] == [20, 20]
assert until(lambda: [pw[r][1] for r in range(2)] == [60, 120]), [pw[r][1] for r in range(2)]
doors[0].drop()
del doors, progs

# a failed staged step left with a send UCX cannot cancel (1 MiB: rendezvous; its peer never receives) is
# released at its timeout: its done word written and the engine lingering while the send stays in flight;
# meanwhile the watchdog's thread (NetWatch) releases the words of a held engine; closing force-closes the
# endpoint under the lingering send
c, d = engine_pair(ne)
words = (ctypes.c_uint32 * 16)()
wa = ctypes.addressof(words)
big, _small = held_send(ne, c, words, 1)
vals = (ctypes.c_uint32 * 8)(7)
assert until(lambda: d.beats > 0)  # the watch judges a thread only once it has looped
d.hold(5)
watch = ne.NetWatch((d,), wa + 48, (wa + 8,), ctypes.addressof(vals), 0.5, None)
assert until(lambda: words[1] == 1, 5.0) and c.lingering == 1 and c.error() is not None
assert until(lambda: words[2] == 7 and words[12] == 2, 5.0) and watch.released == 1, (list(words), watch.released)
watch.close()
d.hold(0)
# the peer takes the send after all: the released batch ends (its extra reference dropped, nothing written)
r = d.recv(0, np.zeros_like(big))
assert r.wait(10) and until(lambda: c.lingering == 0, 5.0) and words[1] == 1
# a second one still lingering when the engine closes: endpoints force-closed under it (or, with UCX's
# registration cache off, as here under the sanitizers, left to the process's end)
held = held_send(ne, c, words, 2)
assert until(lambda: words[1] == 2 and c.lingering == 1, 5.0), (list(words), c.lingering)
c.close()
assert c.lingering == 0
d.close()

# goodbyes: two engines that exchanged a message close at once from two threads, each waiting for the other's
# confirmation (sent from the other's engine thread) before its endpoints close
e, f = engine_pair(ne)
x, y = np.arange(64, dtype=np.int32), np.zeros(64, np.int32)
r = f.recv(0, y)
assert e.send(1, x).wait(5) and r.wait(5) and np.array_equal(x, y)
lates = [None, None]
ts = [threading.Thread(target=lambda i=i, g=g: lates.__setitem__(i, g.close(5.0))) for i, g in enumerate((e, f))]
for t in ts:
    t.start()
for t in ts:
    t.join()
assert lates == [[], []], lates

r = b.recv(0, np.zeros(4, np.uint8))
b.abort(0)
try:
    r.wait(5)
    raise AssertionError("an aborted receive completed")
except ne.EngineError:
    pass
assert a.ctrl_send(1, 2, 0, 1).wait(5)
until(lambda: bool(b.ctrl_poll()), 2.0)
held = a.send(1, np.ones(1 << 18, np.float32))  # a rendezvous send nobody receives, dropped in flight: parked
del held
assert ne.parked() <= 1
a.close()
assert ne.parked() == 0  # let go at its engine's close
b.close()
print("DRIVE OK", flush=True)
