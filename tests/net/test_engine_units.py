"""The native network engine (hpccl._netengine) on its own: two engines in one process, connected over
UCX's TCP transport, driven through the same entry points the transports use. Covers what the GPU path
relies on without a GPU: ready-word gating, done words in order, captured-step templates reposted by
their host function (called here as CUDA's host-function thread would), size mismatches, abort, a peer
that goes away, and control messages."""
from __future__ import annotations

import ctypes
import threading
import time

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_pair import engine_pair, engine_world  # noqa: E402

try:
    from hpccl.transport.engine import load
    ne = load()
except ImportError as exc:  # pragma: no cover - the engine is built by the normal install
    pytest.skip(f"the network engine is not built here: {exc}", allow_module_level=True)



@pytest.fixture()
def pair():
    a, b = engine_pair(ne)
    yield a, b
    a.close()
    b.close()


def _words(n):
    w = (ctypes.c_uint32 * n)()
    return w, [ctypes.addressof(w) + 4 * i for i in range(n)]


def _until(pred, seconds=10.0):
    end = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(1e-4)
    return True


def test_messages_match_in_call_order(pair):
    a, b = pair
    xs = [np.full(1000 + i, i, dtype=np.int32) for i in range(20)]
    ys = [np.zeros_like(x) for x in xs]
    recvs = [b.recv(0, y) for y in ys]
    sends = [a.send(1, x) for x in xs]
    for op in recvs + sends:
        assert op.wait(10.0)
    for x, y in zip(xs, ys):
        assert np.array_equal(x, y)


def test_gated_step_posts_nothing_before_its_token_and_writes_done_in_order(pair):
    a, b = pair
    words, addr = _words(4)  # a: ready, done; b: ready, done
    src = np.arange(4096, dtype=np.float32)
    dst = np.zeros_like(src)
    stage_a = np.zeros_like(src)
    # two steps each way; b's receive buffer must stay untouched until b's token says it may be reused
    for k in (1, 2):
        a.staged([(ne.SEND, 1, src.ctypes.data, src.nbytes), (ne.RECV, 1, stage_a.ctypes.data, src.nbytes)],
                 addr[0], k, addr[1], k, 10.0, f"step {k}")
        b.staged([(ne.RECV, 0, dst.ctypes.data, dst.nbytes), (ne.SEND, 0, src.ctypes.data, src.nbytes)],
                 addr[2], k, addr[3], k, 10.0, f"step {k}")
    time.sleep(0.2)
    assert words[1] == 0 and words[3] == 0 and not dst.any(), "a step ran before its ready token"
    words[0] = 1
    words[2] = 1
    assert _until(lambda: words[1] == 1 and words[3] == 1)
    assert np.array_equal(dst, src)
    dst[:] = 0
    time.sleep(0.1)
    assert words[1] == 1 and not dst.any(), "step 2 ran before its token"
    words[0] = 2
    words[2] = 2
    assert _until(lambda: words[1] == 2 and words[3] == 2)
    assert np.array_equal(dst, src)
    assert a.error() is None and b.error() is None


def _replay(words, done, arm):
    """What a graph replay's stream does before its wait: clear the done word, then set the arm word."""
    words[done] = 0
    words[arm] = 1


def test_templates_repost_per_replay_in_their_own_tag_space(pair):
    a, b = pair
    words, addr = _words(4)  # done a, done b, arm a, arm b
    src = np.zeros(2048, dtype=np.float64)
    dst = np.zeros_like(src)
    ta = a.template([(ne.SEND, 1, src.ctypes.data, src.nbytes)], addr[0], addr[2], 10.0, "captured send")
    tb = b.template([(ne.RECV, 0, dst.ctypes.data, dst.nbytes)], addr[1], addr[3], 10.0, "captured recv")
    # an eager message in flight between the replays must not be matched by them (nor match them)
    eager_src, eager_dst = np.full(2048, -1.0), np.zeros(2048)
    er = b.recv(0, eager_dst)
    for replay in range(100):
        src[:] = replay
        # the words are written from another thread, as the GPU would write them
        t = threading.Thread(target=lambda: (_replay(words, 1, 3), _replay(words, 0, 2)))
        t.start()
        t.join()
        assert _until(lambda: words[0] == 1 and words[1] == 1), f"replay {replay} did not complete"
        assert words[2] == 0 and words[3] == 0, "the engine clears the arm word it acts on"
        assert dst[0] == replay and dst[-1] == replay, replay
        if replay == 50:
            es = a.send(1, eager_src)
            assert er.wait(10.0) and es.wait(10.0)
            assert np.all(eager_dst == -1.0)
    assert ta.state()[1] == 100 and tb.state()[1] == 100
    time.sleep(0.05)
    assert ta.state()[1] == 100, "a template is posted only when its arm word is set"
    ta.retire()
    words[0], words[2] = 0, 1  # a retired template's arm word is no longer read
    time.sleep(0.1)
    assert words[0] == 0 and words[2] == 1 and ta.state()[1] == 100
    assert a.error() is None and b.error() is None


def test_a_failed_template_left_with_a_send_ucx_holds_answers_its_replays(pair):
    """A captured step whose peer never posts its side: at its timeout the receive is cancelled, but UCX
    cannot cancel a rendezvous-sized send, so the template is released (its done word written, the engine
    ``lingering``) and every later replay ends at once, failed, without posting anything (the graph's stream
    must not wait for sends that end only when the endpoint closes)."""
    a, _b = pair
    words, addr = _words(2)  # done, arm
    src = np.ones(1 << 18, dtype=np.float32)  # 1 MiB: rendezvous over TCP
    dst = np.zeros(16, dtype=np.float32)
    t = a.template([(ne.SEND, 1, src.ctypes.data, src.nbytes), (ne.RECV, 1, dst.ctypes.data, dst.nbytes)],
                   addr[0], addr[1], 0.3, "captured step")
    t0 = time.monotonic()
    _replay(words, 0, 1)
    assert _until(lambda: words[0] == 1, 5.0), "the failed replay never wrote its done word"
    assert 0.25 < time.monotonic() - t0 < 3 and a.lingering == 1
    err = a.error()
    assert err is not None and "timed out" in err[2], err
    for _ in range(3):
        t1 = time.monotonic()
        _replay(words, 0, 1)
        assert _until(lambda: words[0] == 1, 2.0) and time.monotonic() - t1 < 0.25
        assert words[1] == 0 and t.state()[1] == 1, "answered without being posted again"
    t.retire()


def test_a_dropped_send_ucx_holds_is_parked_not_waited_for(pair):
    """A send Op dropped in flight (an exception unwound past it) whose receiver never came: UCX cannot cancel
    it, and dropping it used to wait a second for it (past HPCCL_TIMEOUT in a failed collective). Its buffer
    is parked instead, held while UCX may read it, and let go once the send ends."""
    a, b = pair
    big = np.ones(1 << 20, np.float32)  # 4 MiB: a rendezvous send, in flight until the peer receives
    held = sys.getrefcount(big)
    op = a.send(1, big)
    time.sleep(0.2)
    assert not op.ended() and sys.getrefcount(big) == held + 1
    t0 = time.monotonic()
    del op
    assert time.monotonic() - t0 < 0.2
    assert ne.parked() == 1 and sys.getrefcount(big) == held + 1  # still held: UCX reads it when the peer comes
    got = np.zeros_like(big)
    assert b.recv(0, got).wait(10) and np.array_equal(got, big)
    assert _until(lambda: ne.parked() == 0, 5.0) and sys.getrefcount(big) == held
    small = np.zeros(4, np.float32)  # a receive dropped in flight is still waited for (UCX writes into it)
    r = b.recv(0, small)
    a.send(1, np.ones(4, np.float32)).wait(5)
    del r
    assert ne.parked() == 0 and small[0] == 1


def test_a_parked_send_is_let_go_when_its_engine_closes():
    a, b = engine_pair(ne)
    big = np.ones(1 << 20, np.float32)
    held = sys.getrefcount(big)
    op = a.send(1, big)
    time.sleep(0.1)
    del op
    assert ne.parked() == 1
    a.close()
    assert ne.parked() == 0 and sys.getrefcount(big) == held
    b.close()


@pytest.mark.parametrize("setting", ["UCX_MEM_EVENTS=n", "UCX_RCACHE_ENABLE=n"])
def test_closing_under_a_held_send_with_the_cache_off_in_a_ucx_conf(setting, tmp_path):
    """UCX's registration cache turned off in a ucx.conf, not the environment: the engine reads UCX's own
    parsed settings (no_rcache), so closing it while UCX still holds a failed step's rendezvous send leaves
    the send alone instead of force-closing its endpoint, which crashes inside UCX without the cache (it did:
    the check read only the environment)."""
    import os
    import subprocess
    (tmp_path / "ucx.conf").write_text(setting + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_MEM_EVENTS", "UCX_RCACHE_ENABLE")}
    env.update(UCX_CONFIG_DIR=str(tmp_path), UCX_WARN_UNUSED_ENV_VARS="n")
    script = Path(__file__).resolve().parent.parent / "scripts" / "close_under_held_send.py"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "CLOSED" in p.stdout, out[-2000:]
    assert "no_rcache True" in p.stdout and "lingering 1" in p.stdout, out[-2000:]


def test_templates_match_by_pair_when_ranks_capture_different_steps():
    """Rank 0 captures a step with rank 1, then one with rank 2; ranks 1 and 2 capture one step each (as a
    tree or linear schedule leaves ranks out of steps): each pair numbers the templates it shares alike, so
    the replays meet."""
    a, b, c = engine_world(ne, 3)
    try:
        words, addr = _words(8)  # done 0..3, arm 0..3 (rank 0's two templates, rank 1's, rank 2's)
        x, y = np.arange(64, dtype=np.float64), np.arange(64, dtype=np.float64) * 2
        gb, gc = np.zeros_like(x), np.zeros_like(y)
        t = [a.template([(ne.SEND, 1, x.ctypes.data, x.nbytes)], addr[0], addr[4], 5.0, "step 1"),
             a.template([(ne.SEND, 2, y.ctypes.data, y.nbytes)], addr[1], addr[5], 5.0, "step 2"),
             b.template([(ne.RECV, 0, gb.ctypes.data, gb.nbytes)], addr[2], addr[6], 5.0, "step 1"),
             c.template([(ne.RECV, 0, gc.ctypes.data, gc.nbytes)], addr[3], addr[7], 5.0, "step 2")]
        for replay in range(3):
            gb[:], gc[:] = 0, 0
            for i in (2, 3, 0, 1):
                _replay(words, i, 4 + i)
            assert _until(lambda: all(words[i] == 1 for i in range(4)), 10.0), (replay, list(words))
            assert np.array_equal(gb, x) and np.array_equal(gc, y), replay
        assert all(e.error() is None for e in (a, b, c))
        for tt in t:
            tt.retire()
    finally:
        for e in (a, b, c):
            e.close()


def test_a_template_needs_an_arm_word(pair):
    a, _b = pair
    words, addr = _words(1)
    with pytest.raises(ValueError, match="arm word"):
        a.template([(ne.SEND, 1, addr[0], 4)], addr[0], 0, 10.0, "captured")


def test_size_mismatch_is_an_error_naming_the_sender(pair):
    a, b = pair
    r = b.recv(0, np.zeros(2, np.float32))
    s = a.send(1, np.zeros(3, np.float32))
    with pytest.raises(ne.EngineError) as info:
        r.wait(10.0)
    code, peer, msg = info.value.args
    assert code == ne.E_SIZE and peer == 0 and "rank 0" in msg
    s.wait(10.0)


def test_staged_step_times_out_naming_the_silent_rank_and_still_writes_done(pair):
    a, b = pair
    words, addr = _words(2)
    buf = np.zeros(16, np.uint8)
    a.staged([(ne.RECV, 1, buf.ctypes.data, buf.nbytes)], 0, 0, addr[1], 7, 0.3, "all_reduce #9")
    assert _until(lambda: words[1] == 7, 5.0), "a timed-out step left its done word unwritten"
    code, peer, msg = a.error()
    assert code == ne.E_TIMEOUT and "all_reduce #9" in msg and "[1]" in msg


def test_a_held_engine_does_nothing_until_let_go(pair):
    """Engine.hold (fault injection for the GPU kernels' backstop test): a held engine neither moves a ready
    step nor times it out nor writes its done word; let go, it finishes the step."""
    a, b = pair
    words, addr = _words(4)
    src = np.arange(1024, dtype=np.float32)
    dst = np.zeros_like(src)
    a.hold(30)
    a.staged([(ne.SEND, 1, src.ctypes.data, src.nbytes)], addr[0], 1, addr[1], 1, 0.2, "all_reduce #1")
    b.staged([(ne.RECV, 0, dst.ctypes.data, dst.nbytes)], addr[2], 1, addr[3], 1, 10.0, "all_reduce #1")
    words[0] = words[2] = 1
    time.sleep(0.6)  # past the held step's 0.2 s timeout
    assert words[1] == 0 and words[3] == 0 and not dst.any() and a.error() is None
    a.hold(0)
    assert _until(lambda: words[3] == 1 and words[1] == 1)
    assert np.array_equal(dst, src)


def test_abort_fails_what_waits(pair):
    a, b = pair
    r = b.recv(0, np.zeros(8, np.uint8))
    b.abort(0)
    with pytest.raises(ne.EngineError) as info:
        r.wait(5.0)
    assert info.value.args[0] == ne.E_ABORT


def test_control_messages_and_abort_from_a_peer(pair):
    a, b = pair
    words, addr = _words(1)
    buf = np.zeros(8, np.uint8)
    b.staged([(ne.RECV, 0, buf.ctypes.data, buf.nbytes)], 0, 0, addr[0], 3, 0.0, "broadcast #2")
    got: list = []
    assert a.ctrl_send(1, 2, 0, 41).wait(5.0)  # a query
    assert _until(lambda: bool(got.extend(b.ctrl_poll()) or got))
    assert got[0] == (2, 0, 41)
    assert a.ctrl_send(1, 1, 0, 42).wait(5.0)  # an abort: the waiting step ends at once, done written
    assert _until(lambda: words[0] == 3, 5.0)
    code, peer, msg = b.error()
    assert code == ne.E_ABORT and peer == 0 and "rank 0" in msg


def test_a_closed_peer_fails_a_waiting_receive_naming_it():
    a, b = engine_pair(ne, KEEPALIVE_INTERVAL="1s")
    try:
        first = b.recv(0, np.zeros(1, np.uint8))
        assert a.send(1, np.zeros(1, np.uint8)).wait(5.0) and first.wait(5.0)
        r = b.recv(0, np.zeros(1, np.uint8))
        t0 = time.monotonic()
        a.close()
        with pytest.raises(ne.EngineError) as info:
            while not r.wait(0.1):
                assert time.monotonic() - t0 < 10, "the closed peer was never noticed"
        assert info.value.args[0] == ne.E_PEER and info.value.args[1] == 0
        assert b.dead()[0] == 0
    finally:
        a.close()
        b.close()


def test_a_goodbye_waits_until_the_peer_has_read_what_it_was_sent():
    """close(wait) says goodbye to each peer it exchanged messages with and returns only once that peer's engine
    has read everything sent before (here rank 1's engine is held for 1 s): then nothing in flight is lost to
    the closed connection. Rank 1 takes the connection's end for a goodbye, not a failure, and a receive from
    rank 0 posted after it fails naming the closed rank."""
    a, b = engine_pair(ne)
    try:
        warm = b.recv(0, np.zeros(4, np.uint8))
        assert a.send(1, np.ones(4, np.uint8)).wait(5.0) and warm.wait(5.0)
        x = np.arange(256, dtype=np.int32)
        b.hold(1.0)
        t0 = time.monotonic()
        assert a.send(1, x).wait(5.0)  # done here: the bytes are on their way, not yet read by rank 1
        late = a.close(10.0)
        took = time.monotonic() - t0
        assert late == [] and took > 0.7, f"close returned after {took:.2f}s, late {late}"
        y = np.zeros_like(x)
        assert b.recv(0, y).wait(5.0)
        assert np.array_equal(x, y)
        r = b.recv(0, np.zeros(4, np.uint8))
        with pytest.raises(ne.EngineError) as info:
            t1 = time.monotonic()
            while not r.wait(0.1):
                assert time.monotonic() - t1 < 10, "the closed peer was never noticed"
        assert info.value.args[1] == 0 and "closed its communicator" in str(info.value)
        assert b.dead() is None
    finally:
        a.close()
        b.close()


def test_a_goodbye_gives_up_on_a_peer_that_does_not_answer_in_time():
    a, b = engine_pair(ne)
    try:
        assert a.send(1, np.zeros(4, np.uint8)).wait(5.0)
        b.hold(3.0)
        t0 = time.monotonic()
        late = a.close(0.5)
        took = time.monotonic() - t0
        assert late == [1] and 0.45 < took < 2.5, f"close returned after {took:.2f}s, late {late}"
    finally:
        b.hold(0)
        a.close()
        b.close()


def test_a_goodbye_does_not_ask_peers_on_this_node():
    """A peer on this node is not asked: its endpoint (no peer-failure mode) would never report that it closed
    first, so a goodbye to it would wait out the whole bound."""
    a, b = engine_pair(ne, remote=False)
    try:
        r = b.recv(0, np.zeros(4, np.uint8))
        assert a.send(1, np.ones(4, np.uint8)).wait(5.0) and r.wait(5.0)
        assert b.close(5.0) == []
        t0 = time.monotonic()
        assert a.close(5.0) == [] and time.monotonic() - t0 < 1.0
    finally:
        a.close()
        b.close()


def test_control_messages_left_unread_at_close_are_taken(capfd):
    """Control messages that arrive after the standing receive is gone (a peer's goodbye crossing this
    engine's own) are taken before the worker is destroyed: UCX warns of no unread message. Here rank 0's
    engine is held, so three control messages wait in its socket until its close reads them."""
    a, b = engine_pair(ne)
    try:
        r = a.recv(1, np.zeros(4, np.uint8))  # wired up both ways first: a held engine cannot answer wire-up
        assert b.send(0, np.ones(4, np.uint8)).wait(5.0) and r.wait(5.0)
        a.hold(30)
        assert all(b.ctrl_send(0, 2, 1, k).wait(5.0) for k in range(3))
        time.sleep(0.1)
        a.close()
        assert a.ctrl_drained >= 2  # the first may still meet the standing receive, cancelled later in close
    finally:
        a.close()
        b.close()
    err = capfd.readouterr().err
    assert "was not matched" not in err, err


def test_close_without_wait_and_an_aborted_engine_say_no_goodbye(pair):
    a, b = pair
    assert a.send(1, np.zeros(4, np.uint8)).wait(5.0)
    b.hold(3.0)
    a.abort(0)
    t0 = time.monotonic()
    assert a.close(5.0) == [] and time.monotonic() - t0 < 2.0
    b.hold(0)


def test_a_gated_step_whose_node_failed_sends_nothing(pair):
    """A staged step whose gate word (hier: the node step's GPU error word) is set when its token comes fails
    at once, writes its done word, and sends nothing: the peer's receive of that step gets no data; the next
    step, with the gate clear, is delivered."""
    a, b = pair
    words, addr = _words(5)  # a's ready and done, b's done, the gate, a's second done
    gate = addr[3]
    src = np.arange(16, dtype=np.uint8) + 1
    dst = np.zeros(16, np.uint8)
    b.staged([(ne.RECV, 0, dst.ctypes.data, dst.nbytes)], 0, 0, addr[2], 1, 2.0, "all_reduce #3")
    words[3] = 2  # the node step failed before this step's token
    a.staged([(ne.SEND, 1, src.ctypes.data, src.nbytes)], addr[0], 1, addr[1], 1, 5.0, "all_reduce #3", gate)
    words[0] = 1  # the token
    assert _until(lambda: words[1] == 1, 5.0), "a gated step left its done word unwritten"
    code, peer, msg = a.error()
    assert code == ne.E_ABORT and "nothing was sent" in msg
    assert _until(lambda: words[2] == 1, 5.0)  # b's receive ended (its timeout): no data came
    assert not dst.any(), "a gated step sent its data"


def test_a_failed_gated_step_sets_its_gate_before_its_done_word(pair):
    """Issue 32's wrong result on GPU buffers at 3 nodes x 2: a rank whose network step failed let the node
    step after it run on what the step left, and its local peer took that for data. A gated step that fails
    (here: its peer never sends, 0.2 s timeout) writes HPCCL_ERR_NET (5) into the gate word (the node's GPU
    error word, which the node's kernels and local peers check) before its done word releases the stream;
    a step that succeeds leaves the gate as it was."""
    a, b = pair
    words, addr = _words(6)  # a's ready, a's done, the gate, a's second ready and done, b's done
    buf = np.zeros(16, np.uint8)
    a.staged([(ne.RECV, 1, buf.ctypes.data, buf.nbytes)], addr[0], 1, addr[1], 1, 0.2, "all_gather #6", addr[2])
    words[0] = 1
    assert _until(lambda: words[1] == 1, 5.0), "a failed gated step left its done word unwritten"
    assert words[2] == 5, "the gate (node error word) was not set by the failed step"
    assert a.error()[0] == ne.E_TIMEOUT


def test_a_gated_step_that_succeeds_leaves_its_gate(pair):
    a, b = pair
    words, addr = _words(4)  # a's ready, a's done, the gate, b's done
    src = np.arange(16, dtype=np.uint8) + 1
    dst = np.zeros(16, np.uint8)
    b.staged([(ne.RECV, 0, dst.ctypes.data, dst.nbytes)], 0, 0, addr[3], 1, 5.0, "all_gather #6")
    a.staged([(ne.SEND, 1, src.ctypes.data, src.nbytes)], addr[0], 1, addr[1], 1, 5.0, "all_gather #6", addr[2])
    words[0] = 1
    assert _until(lambda: words[1] == 1 and words[3] == 1, 5.0)
    assert words[2] == 0 and (dst == src).all()


def test_a_refused_engine_leaves_the_process_files_alone():
    """An Engine refused before its set-up (rank out of range, bad arguments) is freed without closing file
    descriptor 0 (its wake-up fd was still 0, and closing it took the process's stdin)."""
    import gc
    import os
    r, w = os.pipe()
    saved = os.dup(0)
    try:
        os.dup2(r, 0)  # fd 0 is a pipe we own: whether it is still open after the engines go is checked
        for bad in ((5, 2), (0, 0), ("x", 2)):
            with pytest.raises((ValueError, TypeError)):
                ne.Engine(*bad, {"TLS": "tcp,self"})
        gc.collect()
        os.fstat(0)  # raises OSError (EBADF) if an engine closed it
        os.write(w, b"x")
        assert os.read(0, 1) == b"x"
    finally:
        os.dup2(saved, 0)
        for fd in (saved, r, w):
            os.close(fd)


@pytest.mark.parametrize("in_service", [False, True])
def test_the_transport_waits_for_goodbyes_only_once_in_service(in_service, monkeypatch):
    """EngineTransport.close asks its engines (the lanes, then the first) to wait HPCCL_TIMEOUT for goodbyes
    only when its set-up succeeded; a transport whose set-up failed closes with no wait, since a peer may
    have no engine to answer (a wire-up that failed there would otherwise hold close for HPCCL_TIMEOUT)."""
    from hpccl.transport.engine import EngineTransport

    class Eng:
        def __init__(self):
            self.waits = []

        def close(self, wait):
            self.waits.append(wait)
            return []

    monkeypatch.setenv("HPCCL_TIMEOUT", "42")
    t = EngineTransport.__new__(EngineTransport)
    first, lane = Eng(), Eng()
    t.eng, t.lanes, t.rank, t._closed, t._in_service, t._pool = first, [first, lane], 0, False, in_service, {}
    t.close()
    t.close()  # twice: the engines are closed once
    assert first.waits == lane.waits == [42.0 if in_service else 0.0]
