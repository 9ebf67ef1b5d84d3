"""One-kernel network steps on the CPU's stand-in GPU (tests/net/standin_gpu.py): fused small steps and piped
large ones replay with their token and done values patched, match the sliced path, and captured ones arm their
template at every replay; a graph replayed after its communicator closed ends and is logged."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standin_gpu import FUSED, PIPED, Mem, _all_reduce, _net, lanes, pair  # noqa: E402,F401 (fixtures)

from hpccl.gpu import netreplay, netstage  # noqa: E402


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
