"""The sliced GPU network step (hpccl/gpu/netstep.py, HPCCL_NET_SLICE) against a recording stand-in for the CUDA
driver and the engine, on the CPU: every message is cut by its length alone (so both ends' per-peer tag
sequences agree whichever path each took), slice i+1's copy-out to the host is enqueued before the stream
waits for slice i, and the received pieces together cover each receive buffer exactly once."""
from __future__ import annotations

import numpy as np

from hpccl.gpu import netplan, netstage, netstep


class _Rec:
    """Records the stream's operations in order; every call succeeds."""

    def __init__(self, capturing: bool = False) -> None:
        self.log: list = []
        self._capturing = capturing

    def capturing(self, stream):
        return self._capturing

    def host_alloc(self, n):
        import ctypes
        b = ctypes.create_string_buffer(n)
        self.__dict__.setdefault("_held", []).append(b)
        return ctypes.addressof(b)

    def host_device_pointer(self, h):
        return h

    def memcpy_dtoh(self, host, dev, n, s):
        self.log.append(("dtoh", dev, n))
        return 0

    def write_value32(self, s, addr, v, flags):
        self.log.append(("ready", v))
        return 0

    def wait_value32(self, s, addr, v, how):
        self.log.append(("wait", v))
        return 0


class _Eng:
    def __init__(self, log: list) -> None:
        self.log, self.batches = log, []

    def staged(self, ops, ready_h, tok, done_h, val, timeout, label, gate):
        self.batches.append(list(ops))
        self.log.append(("batch", val))

    def template(self, ops, done_h, arm_h, timeout, label):
        self.batches.append(list(ops))
        self.log.append(("template", done_h, arm_h))
        return object()


class _Area:
    host, dev, nbytes = 1 << 32, 1 << 40, 1 << 30


def _net(slice_bytes: int, lanes: int = 1):
    n = object.__new__(netstep.StagedNet)
    n.driver = _Rec()
    n.eng = _Eng(n.driver.log)
    n.engs = [n.eng] * lanes
    n.dones = [(0, 0)] * lanes
    n.gate, n.timeout, n.slice = None, 5.0, slice_bytes
    n.st = netstage.new_state()
    n.rec = None
    n.ready_d = n.done_d = n.ready_h = n.done_h = 0
    n.steps = 0
    n.staging = lambda total: _Area()
    return n


def _run(slice_bytes: int, nbytes: int, buf=None):
    net = _net(slice_bytes)
    buf = np.zeros(nbytes // 4, np.float32) if buf is None else buf
    got = []
    net.step(0, [(1, 0x1000, nbytes)], [(1, nbytes, buf, None, None)], "all_reduce #1",
             lambda addr, r: got.append((addr - _Area.dev, r[1], r[2])))
    return net, got, buf


def _per_peer(net):
    return [(k, p, ln) for b in net.eng.batches for k, p, _a, ln in b]


def test_a_message_is_cut_by_its_length_alike_on_both_paths():
    n = 10 * 1024 + 512
    sliced, _, _ = _run(4096, n)
    whole_path = _net(4096)  # a non-contiguous receive buffer keeps the step whole, in the same pieces
    nc = np.zeros(n // 2, np.float32)[::2]
    whole_path.step(0, [(1, 0x1000, n)], [(1, n, nc, None, None)], "x", lambda a, r: None)
    assert len(sliced.eng.batches) == 3 and len(whole_path.eng.batches) == 1
    assert sorted(_per_peer(sliced)) == sorted(_per_peer(whole_path))
    assert [ln for k, _p, ln in _per_peer(sliced) if k == 0] == [3584, 3584, 3584]  # equal, 256-byte units


def test_the_next_slice_is_copied_out_before_the_wait_for_the_previous():
    net, got, buf = _run(4096, 3 * 4096)  # 3 slices of exactly 4096
    log = net.driver.log
    for i in range(2):  # dtoh of slice i+1 precedes the stream's wait for slice i's done value
        assert log.index(("dtoh", 0x1000 + 4096 * (i + 1), 4096)) < log.index(("wait", i + 1))
    assert [e for e in log if e[0] == "wait"] == [("wait", 1), ("wait", 2), ("wait", 3)]
    # the pieces handed out cover the receive buffer once, in order, as views of it
    assert [(off, ln) for off, ln, _v in got] == [(3 * 4096 + 4096 * i, 4096) for i in range(3)]
    for k, (_o, _l, v) in enumerate(got):
        v[:] = k + 1
    assert buf.tolist() == [1.0] * 1024 + [2.0] * 1024 + [3.0] * 1024
    assert sum(v.size for _o, _l, v in got) == 3 * 1024


def test_messages_within_a_slice_take_the_unsliced_path():
    net, got, _ = _run(1 << 20, 4096)
    assert len(net.eng.batches) == 1 and [ln for _k, _p, ln in _per_peer(net)] == [4096, 4096]
    assert len(got) == 1 and got[0][1] == 4096


def test_lanes_deepen_the_pipeline():
    """With 4 lanes, slices 0-3 are all on the wire (their copies out to the host enqueued, one lane each)
    before the stream waits for slice 0; slice i goes to lane i mod 4 on both paths."""
    net = _net(4096, lanes=4)
    buf = np.zeros(6 * 1024, np.float32)
    net.step(0, [(1, 0x1000, 6 * 4096)], [(1, 6 * 4096, buf, None, None)], "x", lambda a, r: None)
    log = net.driver.log
    first_wait = next(i for i, e in enumerate(log) if e[0] == "wait")
    assert [e for e in log[:first_wait] if e[0] == "dtoh"] == [("dtoh", 0x1000 + 4096 * i, 4096) for i in range(4)]
    assert len([e for e in log if e[0] == "wait"]) == 6
    whole = _net(4096, lanes=4)  # the unsliced path cuts the same pieces onto the same lanes, in one post
    nc = np.zeros(12 * 1024, np.float32)[::2]
    whole.step(0, [(1, 0x1000, 6 * 4096)], [(1, 6 * 4096, nc, None, None)], "x", lambda a, r: None)
    assert sorted(_per_peer(whole)) == sorted(_per_peer(net))


def test_lanes_cut_a_message_of_few_slices_into_a_piece_per_lane():
    """A message within one slice but of several MIN_PIECEs goes out in one post, a piece on each lane (the
    wire of every lane busy); smaller ones stay whole; more pieces than lanes when the slices say so."""
    mp = netplan.MIN_PIECE
    net = _net(1 << 20, lanes=4)
    assert net._pieces(512 << 10) == [(i * (128 << 10), 128 << 10) for i in range(4)]
    assert net._pieces(2 * mp) == [(0, mp), (mp, mp)]
    assert net._pieces(2 * mp - 256) == [(0, 2 * mp - 256)]
    assert [ln for _o, ln in net._pieces(5 << 20)] == [1 << 20] * 5
    assert net._pieces(0) == [(0, 0)]
    one = _net(1 << 20, lanes=1)
    assert one._pieces(512 << 10) == [(0, 512 << 10)]
    buf = np.zeros((512 << 10) // 4, np.float32)
    net.step(0, [(1, 0x1000, 512 << 10)], [(1, 512 << 10, buf, None, None)], "x", lambda a, r: None)
    assert len(net.eng.batches) == 4  # one batch per lane, posted together
    assert sorted(ln for _k, _p, ln in _per_peer(net)) == [128 << 10] * 8


def test_a_captured_step_is_a_template_per_lane_armed_then_waited():
    """Under capture: a template per lane that has pieces (one piece per lane, equal), each with words of its
    own; the graph clears every done word and sets every arm word before it waits for any done word."""
    net = _net(1 << 20, lanes=4)
    net.driver = _Rec(capturing=True)
    net.eng = _Eng(net.driver.log)
    net.engs = [net.eng] * 4
    net._graph, net._gwords, net._gword_next, net.captured, net._armed = [], None, netstage._WORDS, 0, []
    n = 1 << 20
    buf = np.zeros(n // 4, np.float32)
    net.step(0, [(1, 0x1000, n)], [(1, n, buf, None, None)], "x", lambda a, r: None)
    log = net.driver.log
    tpls = [e for e in log if e[0] == "template"]
    assert len(tpls) == 4 and len(net.eng.batches) == 4
    assert all(sorted(ln for _k, _p, _a, ln in b) == [n // 4, n // 4] for b in net.eng.batches)
    words = [w for _t, d, a in tpls for w in (d, a)]
    assert len(set(words)) == 8, "every lane's template has a done and an arm word of its own"
    writes = [i for i, e in enumerate(log) if e[0] == "ready"]
    waits = [i for i, e in enumerate(log) if e[0] == "wait"]
    assert [log[i][1] for i in writes] == [0, 1] * 4 and [log[i][1] for i in waits] == [1] * 4
    assert max(writes) < min(waits)
    small = _net(1 << 20, lanes=4)
    assert small._lane_pieces(netplan.MIN_PIECE + 256) == [(0, netplan.MIN_PIECE + 256)]
