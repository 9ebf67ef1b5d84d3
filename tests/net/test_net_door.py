"""The C front door of replayed GPU calls across nodes (hpccl/csrc/_netdoor.c, HPCCL_NET_DOOR), on the CPU.

Two real engines talk over UCX; the CUDA driver is standin_gpu.py's stand-in (streams are threads running
enqueued work on host memory), the communicator a stand-in with the attributes the door reads and writes,
and the arrays stand-ins of CuPy's and torch's types (the door is handed the types to take). Checked: a
call whose key matches a recording is replayed, its result right and its bookkeeping the Python path's
(sequence number, waiter, every transport's announce, statistics); anything else that differs in the key,
a group, a destroyed or aborted communicator, a capturing stream or a failed engine is declined with
nothing changed; a rank replaying through the door and a peer on the Python path match."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import standin_gpu as tr  # noqa: E402

from hpccl.gpu import netreplay  # noqa: E402

ne = tr.ne
if not hasattr(ne, "NetDoor"):
    pytest.skip("this build of the network engine has no NetDoor", allow_module_level=True)

COUNT = 2600  # 10400 bytes in 4 KiB slices: 3 network steps per call
F32 = np.dtype(np.float32)


class Ptr:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class CpArray:
    """What the door reads off a CuPy array: data.ptr, size, dtype, _c_contiguous (host memory here)."""

    def __init__(self, a: np.ndarray, contiguous: bool = True) -> None:
        self.a, self.data, self.size, self.dtype = a, Ptr(a.ctypes.data), a.size, a.dtype
        self._c_contiguous = contiguous


class TorchDtype:
    itemsize = 4


FLOAT = TorchDtype()  # torch's dtypes are singletons


class Tensor:
    """What the door reads off a torch tensor: is_cuda, data_ptr(), numel(), is_contiguous(), dtype."""

    is_cuda = True

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.dtype = a, FLOAT

    def data_ptr(self) -> int:
        return self.a.ctypes.data

    def numel(self) -> int:
        return self.a.size

    def is_contiguous(self) -> bool:
        return True


class Waiter:
    collective, seq = "", 0


class Transport:
    def __init__(self) -> None:
        self.seen: list = []

    def announce(self, seq: int) -> None:
        self.seen.append(seq)


class Comm:
    """The attributes of a Communicator the door reads (group, destroyed, aborted, seq) and writes."""

    def __init__(self) -> None:
        self._group, self._destroyed, self._aborted, self._seq = None, False, False, 0
        self._waiter, self._transports = Waiter(), [Transport(), Transport()]


class Failed(Exception):
    pass


def _door(comm: Comm, reps: netreplay.NetReplays):
    d = ne.NetDoor(comm, CpArray, True, lambda: Ptr(1), (Tensor,), netreplay.NAMES, Failed)
    reps.door, reps.nranks = d, 2
    return d


def _key(coll: str, send, recv, op, root: int = -1, st: int = 1) -> tuple:
    part = lambda b: (b.data.ptr, b.size, b.dtype, b._c_contiguous)  # noqa: E731 - as CallKeys reads CuPy
    return (coll, part(send), None if recv is None else part(recv), op, root, st)


def _recorded(pair, wrap, coll: str, part) -> tuple:
    """Two ranks, each a staged net on the stand-in GPU, its recordings, a door and a communicator, with an
    exchange of x into y (sum) recorded on both under ``coll`` (the door only replays it): x and y are
    ``wrap``-ed arrays, their key parts read by ``part``."""
    (ea, eb), gpus = pair
    nets = [tr._net((e,), g, 4096) for e, g in zip((ea, eb), gpus)]
    reps = [netreplay.NetReplays(n, tr.Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    comms = [Comm(), Comm()]
    doors = [_door(c, r) for c, r in zip(comms, reps)]
    xs = [wrap(np.full(COUNT, r + 1, np.float32)) for r in range(2)]
    ys = [wrap(np.zeros(COUNT, np.float32)) for _ in range(2)]
    for r in range(2):
        key = (coll, part(xs[r]), part(ys[r]), "sum", -1, 1)
        rec = reps[r].start(key, 1)
        tr._all_reduce(nets[r], gpus[r], r, xs[r].a, ys[r].a, "#1")
        reps[r].finish(key, rec, True)
    for g in gpus:
        g.drain()
    assert [len(d) for d in doors] == [1, 1] and np.all(ys[0].a == 3)
    return gpus, nets, reps, comms, doors, xs, ys


@pytest.fixture()
def ranks(pair):
    """_recorded's ranks with the all_reduce of x into y recorded (the first call: seq 1)."""
    got = _recorded(pair, CpArray, "ar", lambda b: (b.data.ptr, b.size, b.dtype, b._c_contiguous))
    for c in got[3]:
        c._seq = 1
    yield got
    for g in got[0]:
        assert not g.failed, g.failed


pair = tr.pair


def test_a_recorded_call_is_replayed_and_counted_through_the_door(ranks):
    gpus, nets, reps, comms, doors, xs, ys = ranks
    op = "sum"
    for i in range(2, 12):
        for r in range(2):
            gpus[r].q.put(lambda y=ys[r].a: y.fill(0))
            assert doors[r].fire(0, xs[r], ys[r], op, -1, None) is True
        for g in gpus:
            g.drain()
        assert np.all(ys[0].a == 3) and np.all(ys[1].a == 3), i
    for r in range(2):
        c = comms[r]
        assert c._seq == 11 and (c._waiter.collective, c._waiter.seq) == ("all_reduce", 11)
        assert [t.seen for t in c._transports] == [list(range(2, 12))] * 2
        assert doors[r].fired == 10 and reps[r].replayed == 10
        rows = doors[r].rows("cuda")
        assert [row[:5] for row in rows] == [("all_reduce", "cuda", "replayed", 10, 10 * COUNT * 4)]
        assert rows[0][5] > 0
    assert nets[0].st.tok == 3 * 11 and tr.ctypes.c_uint32.from_address(nets[0].done_h).value == 3 * 11


def test_a_peer_on_the_python_path_matches_a_rank_at_the_door(ranks):
    """Rank 0 replays through the door, rank 1 through NetReplays.fire and the Python path in turn: the
    messages (and tags) are the same, so every result is right."""
    gpus, nets, reps, comms, doors, xs, ys = ranks
    key1 = _key("ar", xs[1], ys[1], "sum")
    for i in range(6):
        gpus[0].q.put(lambda y=ys[0].a: y.fill(0))
        assert doors[0].fire(0, xs[0], ys[0], "sum", -1, None)
        if i % 2:
            assert reps[1].fire(key1, f"all_reduce #{i + 2}") == 0
        else:
            tr._all_reduce(nets[1], gpus[1], 1, xs[1].a, ys[1].a, f"all_reduce #{i + 2}")
        for g in gpus:
            g.drain()
        assert np.all(ys[0].a == 3) and np.all(ys[1].a == 3), i


def test_anything_else_is_declined_with_nothing_changed(ranks):
    """Each way the key or the communicator's state differs from the recording's: fire() says False, and
    neither the sequence number, the transports, the counters nor the engine's token moved."""
    gpus, nets, reps, comms, doors, xs, ys = ranks
    d, c, x, y = doors[0], comms[0], xs[0], ys[0]
    other = np.zeros(COUNT + 1, np.float32)
    cases = {
        "another op": (0, x, y, "max", -1, None),
        "another collective": (1, x, y, "sum", -1, None),
        "another root": (0, x, y, "sum", 0, None),
        "another stream": (0, x, y, "sum", -1, 2),
        "a stream object": (0, x, y, "sum", -1, Ptr(2)),
        "in place": (0, x, None, "sum", -1, None),
        "another send buffer": (0, CpArray(other[:COUNT]), y, "sum", -1, None),
        "another count": (0, CpArray(x.a[:COUNT - 1]), y, "sum", -1, None),
        "another dtype": (0, CpArray(x.a.view(np.int32)), y, "sum", -1, None),
        "not contiguous": (0, CpArray(x.a, contiguous=False), y, "sum", -1, None),
        "numpy": (0, x.a, y, "sum", -1, None),
        "a torch tensor": (0, Tensor(x.a), Tensor(y.a), "sum", -1, 1),
        "a root that is not an int": (0, x, y, "sum", -1.0, None),
        "a collective number out of range": (9, x, y, "sum", -1, None),
    }
    for why, args in cases.items():
        assert d.fire(*args) is False, why
    c._group = []
    assert d.fire(0, x, y, "sum", -1, None) is False, "in a group"
    c._group, c._destroyed = None, True
    assert d.fire(0, x, y, "sum", -1, None) is False, "destroyed"
    c._destroyed, c._aborted = False, True
    assert d.fire(0, x, y, "sum", -1, None) is False, "aborted"
    c._aborted = False
    gpus[0].captures = True
    assert d.fire(0, x, y, "sum", -1, None) is False, "capturing"
    gpus[0].captures = False
    nets[0]._words[12] = 1  # a network kernel gave up on the engine (the stuck word)
    assert d.fire(0, x, y, "sum", -1, None) is False, "a failed engine"
    nets[0]._words[12] = 0
    assert c._seq == 1 and c._transports[0].seen == [] and d.fired == 0 and d.rows("cuda") == []
    assert nets[0].st.tok == 3
    reps[0].drop()
    assert len(d) == 0 and d.fire(0, x, y, "sum", -1, None) is False, "dropped"
    with pytest.raises(TypeError):
        d.fire(0, x, y)


FIRE_SLOT = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong)


def test_the_compiled_torch_backends_way_in_by_slot(ranks):
    """slot() finds where fire() would replay a call (-1: nowhere); the C entry nd_fire_slot (fire_slot, called
    as hpccl/torch/_native.cpp calls it, the GIL held) replays that entry with fire()'s bookkeeping, and
    declines (0, nothing changed) a slot of an older generation (the entries were dropped), of another
    stream, an empty one, and what fire() declines."""
    gpus, nets, reps, comms, doors, xs, ys = ranks
    fire = [FIRE_SLOT(d.fire_slot) for d in doors]
    slots = [d.slot(0, x, y, "sum", -1, None) for d, x, y in zip(doors, xs, ys)]
    gens = [d.generation for d in doors]
    assert all(0 <= s < 512 for s in slots)
    assert doors[0].slot(0, xs[0], ys[0], "max", -1, None) == -1 and doors[0].slot(0, xs[0], None, "sum", -1, 1) == -1
    for i in range(2, 6):
        for r in range(2):
            gpus[r].q.put(lambda y=ys[r].a: y.fill(0))
            assert fire[r](doors[r], slots[r], gens[r], 1) == 1
        for g in gpus:
            g.drain()
        assert np.all(ys[0].a == 3) and np.all(ys[1].a == 3), i
    c, d, tok = comms[0], doors[0], nets[0].st.tok
    assert c._seq == 5 and c._waiter.collective == "all_reduce" and c._transports[1].seen == [2, 3, 4, 5]
    assert d.fired == 4 and d.rows("cuda")[0][:4] == ("all_reduce", "cuda", "replayed", 4)
    declined = {"another stream": (slots[0], gens[0], 2), "an empty slot": ((slots[0] + 1) % 512, gens[0], 1),
                "a slot out of range": (512, gens[0], 1), "an older generation": (slots[0], gens[0] - 1, 1)}
    for why, (slot, gen, st) in declined.items():
        assert fire[0](d, slot, gen, st) == 0, why
    c._group = []
    assert fire[0](d, slots[0], gens[0], 1) == 0, "in a group"
    c._group = None
    assert c._seq == 5 and d.fired == 4 and nets[0].st.tok == tok
    reps[0].drop()
    assert d.generation == gens[0] + 1 and fire[0](d, slots[0], gens[0], 1) == 0, "dropped"
    assert d.slot(0, xs[0], ys[0], "sum", -1, None) == -1
    with pytest.raises(TypeError):
        d.slot(0, xs[0])


def test_torch_tensors_and_the_outputs_python_allocates(pair):
    """A CUDA tensor's key is its data_ptr(), numel(), dtype and is_contiguous(), on the stream given (None:
    torch's current stream on the tensor's device, as torch_stream reads it; declined without one); all_gather
    with no output is declined (the Python path allocates it)."""
    gpus, nets, reps, comms, doors, xs, ys = _recorded(pair, Tensor, "rs",
                                                       lambda t: (t.data_ptr(), t.numel(), t.dtype, True))
    assert doors[0].fire(4, xs[0], ys[0], "sum", -1, None) is False  # no torch_stream given: declined
    (key, prog), = reps[0]._progs.items()
    read: list = []
    d2 = ne.NetDoor(comms[0], CpArray, True, lambda: Ptr(2), (Tensor,), netreplay.NAMES, Failed,
                    torch_stream=lambda t: read.append(t) or 1)
    assert d2.put(4, key[1], key[2], "sum", -1, 1, prog, 4)
    gpus[0].q.put(lambda: ys[0].a.fill(0))
    gpus[1].q.put(lambda: ys[1].a.fill(0))
    assert d2.fire(4, xs[0], ys[0], "sum", -1, None) is True and read == [xs[0]]  # torch's stream, read for x
    assert doors[1].fire(4, xs[1], ys[1], "sum", -1, 1) is True
    for g in gpus:
        g.drain()
    assert np.all(ys[0].a == 3) and np.all(ys[1].a == 3) and comms[0]._seq == 1
    comms[0]._seq = 0
    assert doors[0].fire(3, xs[0], None, None, -1, 1) is False
    not_cuda = Tensor(xs[0].a)
    not_cuda.is_cuda = False
    assert doors[0].fire(4, not_cuda, ys[0], "sum", -1, 1) is False
    for r in range(2):
        gpus[r].q.put(lambda y=ys[r].a: y.fill(0))
        assert doors[r].fire(4, xs[r], ys[r], "sum", -1, 1) is True
    for g in gpus:
        g.drain()
    assert np.all(ys[0].a == 3) and np.all(ys[1].a == 3)
    assert comms[0]._waiter.collective == "reduce_scatter" and comms[0]._seq == 1
    assert doors[0].rows("cuda")[0][:4] == ("reduce_scatter", "cuda", "replayed", 1)


def test_a_failed_driver_call_raises_the_doors_error(pair):
    """The replay's first driver call (the copy of the input to staging) fails: fire() raises the error class
    it was given (HpcclSystemError in hpccl) naming the call, counts nothing, and nothing reached the engine."""
    (ea, eb), gpus = pair
    net = tr._net((ea,), gpus[0], 4096)
    fns = list(gpus[0].entry_points())
    bad = tr.C_DTOH(lambda *a: 700)
    fns[0] = ctypes.cast(bad, ctypes.c_void_p).value
    reps = netreplay.NetReplays(net, tr.Mem(), tuple(fns))
    comm = Comm()
    door = _door(comm, reps)
    x, y = CpArray(np.ones(COUNT, np.float32)), CpArray(np.zeros(COUNT, np.float32))
    rec = reps.start(_key("ar", x, y, "sum"), 1)
    tr._all_reduce(net, gpus[0], 0, x.a, y.a, "all_reduce #1")  # the peer's side: below
    reps.finish(_key("ar", x, y, "sum"), rec, True)
    peer, px, py = tr._net((eb,), gpus[1], 4096), x.a.copy(), np.zeros(COUNT, np.float32)
    tr._all_reduce(peer, gpus[1], 1, px, py, "all_reduce #1")  # the stand-in stream uses px, py until drained
    for g in gpus:
        g.drain()
    assert np.all(py == 2)
    tok = net.st.tok
    with pytest.raises(Failed, match="cuMemcpyDtoHAsync failed \\(CUresult 700\\)"):
        door.fire(0, x, y, "sum", -1, None)
    assert comm._seq == 0 and door.fired == 0 and door.rows("cuda") == [] and net.st.tok == tok
    assert comm._transports[0].seen == []
    del bad


def test_netreplay_door_wires_a_communicator_to_its_recordings(pair, monkeypatch):
    """netreplay.door(): none unless HPCCL_NET_DOOR=1 and the communicator is neither checked nor traced (hier's
    network sub-communicator, whose calls are steps, gets one); otherwise every recording NetReplays.finish keeps is handed to it (bytes per call from the key),
    a tensor with no stream is keyed on torch's current stream of its device, and its counts are in
    comm.stats()."""
    import types
    from hpccl.memory.cuda import CallKeys
    from hpccl.observe.recorder import Recorder, StepRecorder

    class TorchTensor(Tensor):
        def get_device(self) -> int:
            return 0
    fake_torch = types.SimpleNamespace(Tensor=TorchTensor, nn=types.SimpleNamespace(Parameter=Tensor),
                                       _C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda dev: 1 + dev))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    (ea, eb), gpus = pair
    keys = object.__new__(CallKeys)
    keys._cp_nd, keys._cp_contig, keys._cur_stream = CpArray, True, lambda: Ptr(1)
    nets = [tr._net((e,), g, 4096) for e, g in zip((ea, eb), gpus)]
    reps = [netreplay.NetReplays(n, tr.Mem(), g.entry_points()) for n, g in zip(nets, gpus)]
    comms = [Comm(), Comm()]
    for r, c in enumerate(comms):
        c.size, c._check_calls, c._observed, c._rec = 2, False, False, Recorder("t", r, 2, r)
    monkeypatch.setenv("HPCCL_NET_DOOR", "0")
    assert netreplay.door(comms[0], reps[0], keys) is None
    monkeypatch.setenv("HPCCL_NET_DOOR", "1")
    comms[0]._observed = True
    assert netreplay.door(comms[0], reps[0], keys) is None
    comms[0]._observed = False
    step = Comm()  # hier's network sub-communicator (its calls are steps of the user's): a door for its chains
    step.size, step._check_calls, step._observed = 2, False, False
    step._rec = StepRecorder(comms[0]._rec, "inter", "t", 0, 2, 0)
    spare = types.SimpleNamespace()  # door() hands itself to the replays: a stand-in here
    assert netreplay.door(step, spare, keys) is spare.door is not None
    doors = [netreplay.door(c, rp, keys) for c, rp in zip(comms, reps)]
    assert all(d is not None and rp.door is d for d, rp in zip(doors, reps))
    xs = [TorchTensor(np.full(COUNT, r + 1, np.float32)) for r in range(2)]
    ys = [TorchTensor(np.zeros(COUNT, np.float32)) for _ in range(2)]
    for r in range(2):  # recorded as _enter keys it (CallKeys on a tensor, torch's stream: 1)
        key = ("ar", (xs[r].data_ptr(), COUNT, xs[r].dtype, True), (ys[r].data_ptr(), COUNT, ys[r].dtype, True),
               "sum", -1, 1)
        rec = reps[r].start(key, 1)
        tr._all_reduce(nets[r], gpus[r], r, xs[r].a, ys[r].a, "all_reduce #1")
        reps[r].finish(key, rec, True)
    for g in gpus:
        g.drain()
    assert [len(d) for d in doors] == [1, 1]
    for r in range(2):
        gpus[r].q.put(lambda y=ys[r].a: y.fill(0))
        assert doors[r].fire(0, xs[r], ys[r], "sum", -1, None) is True
    for g in gpus:
        g.drain()
    assert np.all(ys[0].a == 3) and np.all(ys[1].a == 3)
    row = comms[0]._rec.stats.snapshot()["all_reduce"]["replayed (cuda)"]
    assert (row["calls"], row["bytes"]) == (1, COUNT * 4)
    reps[0].drop()
    assert len(doors[0]) == 0


COUNT_CALL = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.py_object, ctypes.c_int)


def test_the_compiled_backends_count_of_a_hier_replay():
    """count_call (nd_count), as hpccl/torch/_native.cpp calls it for a hier all_reduce it replays from its
    chain: asked first (commit 0), it says whether the user's communicator takes a replay now (not in a
    group, not destroyed, not aborted) and changes nothing; committed, it counts the call as _run does (the
    next sequence number, the waiter's collective and seq, every transport's announce)."""
    c = Comm()
    d = ne.NetDoor(c, CpArray, True, lambda: Ptr(1), (Tensor,), netreplay.NAMES, Failed)
    count = COUNT_CALL(d.count_call)
    name = "all_reduce"
    c._seq = 7
    assert count(c, name, 0) == 1 and c._seq == 7 and c._transports[0].seen == []
    assert count(c, name, 1) == 1 and count(c, name, 1) == 1
    assert c._seq == 9 and (c._waiter.collective, c._waiter.seq) == ("all_reduce", 9)
    assert c._transports[0].seen == [8, 9] and c._transports[1].seen == [8, 9]
    for attr, value in (("_group", []), ("_destroyed", True), ("_aborted", True)):
        other = Comm()
        setattr(other, attr, value)
        assert count(other, name, 0) == 0, attr
        assert other._seq == 0 and other._transports[0].seen == []
    bad = Comm()
    del bad._transports
    with pytest.raises(AttributeError):
        count(bad, name, 1)
