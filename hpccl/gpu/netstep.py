"""GPU network steps through the native engine, in stream order, with no host sync and no helper thread
of hpccl's own on the data path: the caller's thread enqueues everything and returns.

One exchange (the sends and receives of one step of a ring, tree or linear schedule) becomes, on the
caller's stream S:

    DtoH copies of the send buffers into pinned staging memory
    write token t to the step's "ready" word            (cuStreamWriteValue32)
    wait until the "done" word reaches v                 (cuStreamWaitValue32)
    HtoD copies, or reduce kernels reading the staged data through its device mapping

and the engine (hpccl/csrc/_netcore.c) is handed the step's messages at once: it posts them when it sees
token t (the staged data is in place, and the GPU is done with the previous step's received data, which
shares the staging memory), and writes v when every message has ended, ok or not. The engine never calls
CUDA and never takes the GIL, so nothing the caller's thread does (allocating, loading kernels, holding
the GIL) can stall a step.

Under CUDA graph capture the step becomes a template the engine holds, with words of its own: each replay
clears the step's done word and sets its arm word (stream memory operations, after the staged data is in
place), the engine, which polls the arm words of its templates, posts the step again, and the stream waits
for the done word; no host function runs in the graph. Replays use a tag space of their own
(hpccl/csrc/_netcore.h), so captured and eager steps never match each other's messages. Captured steps get
staging memory and words of their own, kept until the communicator is destroyed.

A failed step (a peer gone, HPCCL_TIMEOUT, an abort) still writes its done word, so no stream stays
blocked; the communicator's next call or synchronize() raises the error, as ncclCommGetAsyncError does.

Messages above HPCCL_NET_SLICE go in slices, a batch per slice pipelined on the stream, and slice i of
every message goes over lane i mod L (HPCCL_NET_LANES: engines of their own, with a done word and counter
each; one ready token per step). What the steps enqueue may be recorded (``rec``) so that a repeated call
is enqueued again by one C call (hpccl/gpu/netreplay.py).
"""
from __future__ import annotations

import ctypes
import re
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import config
from ..errors import HpcclError, HpcclTimeoutError
from .gpu_sync import wanted
from .netplan import MAX_LANES, NetPlan, _align, _flat_recvs, _messages, _piece_of, _sizes
from .netstage import _WORDS, NO_STREAM, ORPHANS, WAIT_GEQ, _Pinned, _put_limit, new_state
from .netwatch import STUCK_WATCH, limit_s, watch


_NETS: "weakref.WeakSet[StagedNet]" = weakref.WeakSet()  # this process's live ones, for "another is live"


class StagedNet(NetPlan):
    """The device half of one communicator's network path: staging memory, the ready/done words, and
    the hand-over of each step to the engine."""

    def __init__(self, engine: Any, device: int, transport: Any = None, lanes: Sequence[Any] = (),
                 share: int = 1) -> None:
        from ..kernels import Driver
        self.eng = engine  # hpccl._netengine.Engine
        # lane j (engines of their own: a UCP worker and a thread each) carries piece j mod L of every
        # message, so one peer's pieces move over L connections at once; lane 0 is the communicator's engine
        self.engs = [engine, *lanes][:MAX_LANES]
        self.transport = transport  # its EngineTransport: who an abort named (step_error)
        # the host address of a word that, set when a step's token comes, means its staged data is not whole
        # (hier: the node step's GPU error word); the engine then sends nothing
        self.gate: Optional[Callable[[], int]] = None
        self.device = device
        self.driver = Driver.get()
        self.timeout = float(config.get("HPCCL_TIMEOUT"))
        self._words = _Pinned(self.driver, 64)
        ctypes.memset(self._words.host, 0, 64)
        # the network kernels' backstop (hp_net_wait): a wait for the engine's done word that outlives
        # 2 x HPCCL_TIMEOUT + 5 s (the engine writes every done word within HPCCL_TIMEOUT, ok or not) gives
        # up and sets a stuck word; words [10..11] and [12] of the eager page, [2..3] and [4] of a captured one
        self.kernel_limit = int((2 * self.timeout + 5) * 1e9) if self.timeout > 0 else 0
        _put_limit(self._words.host + 40, self.kernel_limit)
        self.stuck_h = self._words.host + 48  # the eager steps' stuck word (the C replay reads it too)
        self._cstuck: Dict[int, tuple] = {}  # graph word page (host address) -> (its words, captured stuck words)
        self._cidx: Optional[list] = None  # _cstuck's pages as (words, index array): gave_up() reads one per page
        self.ready_h, self.ready_d = self._words.host, self._words.dev  # one ready word: every lane reads it
        self.dones = [(self._words.host + 4 + 4 * j, self._words.dev + 4 + 4 * j) for j in range(len(self.engs))]
        self.done_h, self.done_d = self.dones[0]
        self.st = new_state()  # tokens, done values, last stream (shared with replays)
        self.rec: Any = None  # a netreplay.Recording while a call is recorded for replay
        self._stage: Optional[_Pinned] = None
        self._old: List[_Pinned] = []  # outgrown staging areas: earlier steps may still use them
        self._graph: List[Any] = []    # captured steps' staging, words and templates (live until close)
        self._armed: List[tuple] = []  # (arm, done) host words of each captured template
        self._gwords: Optional[_Pinned] = None
        self._gword_next = _WORDS
        self._join_ev = self.driver.event()
        self.steps = 0
        self.captured = 0
        self.fused = 0  # steps run as one kernel (step_fused)
        self.fused_size = int(config.get("HPCCL_NET_FUSED_SIZE"))
        self.piped = 0  # steps run as one kernel walking their pieces (step_piped)
        self.pipe = bool(config.get("HPCCL_NET_PIPE"))
        # the fused and piped kernels spin on a done word only this process's engine writes: on a GPU other
        # processes may share (CUDA MPS), such a kernel outlives its process when the process dies, and the
        # MPS server's teardown of it is a fatal fault for every client of the GPU. There every wait of a
        # step is a stream operation instead (docs/RELIABILITY.md, "A peer dies with GPU calls in flight").
        other = any(n is not self and n.device == device for n in list(_NETS))
        self.stream_waits, self.wait_why = wanted(share, other)
        if self.stream_waits:
            self.fused_size, self.pipe = 0, False
        _NETS.add(self)
        sl = int(config.get("HPCCL_NET_SLICE"))
        self.slice = _align(sl) if sl > 0 else 0  # whole 256-byte units: every dtype's elements stay whole
        self._watch = watch(self)  # stream waits without a limit of their own: released if an engine stops

    # ----- memory -------------------------------------------------------------------------------------
    def staging(self, nbytes: int) -> _Pinned:
        """The eager staging area, at least ``nbytes``; one area serves every step in turn (stream order
        keeps a step's copies after the previous step's reads of it)."""
        if self._stage is None or self._stage.nbytes < nbytes:
            if self._stage is not None:
                self._old.append(self._stage)
            self._stage = _Pinned(self.driver, max(nbytes, 1 << 20, 2 * (self._stage.nbytes if self._stage else 0)))
        return self._stage

    def _graph_word(self, n: int = 1) -> tuple:
        """(host, device) address of the first of ``n`` consecutive words for a captured step, zeroed."""
        if self._gwords is None or self._gword_next + n > _WORDS:
            self._gwords = _Pinned(self.driver, 4 * _WORDS)
            ctypes.memset(self._gwords.host, 0, 4 * _WORDS)
            self._graph.append(self._gwords)
            self._gword_next = 0
        i = self._gword_next
        self._gword_next += n
        return self._gwords.host + 4 * i, self._gwords.dev + 4 * i

    # ----- ordering across streams --------------------------------------------------------------------
    def enter(self, stream: int) -> None:
        """A call on a stream other than the last one's waits for the last one's work (the steps share
        staging memory and the engine's order), through the event leave() recorded at its end: never
        through the old stream's handle, which its owner may have destroyed since."""
        st = self.st
        last = st.last_stream
        if last != NO_STREAM and last != stream and st.joinable and not self.driver.capturing(stream):
            self.driver.stream_wait_event(ctypes.c_void_p(stream), ctypes.c_void_p(self._join_ev), 0)
        st.last_stream = stream

    def leave(self, stream: int) -> None:
        """Mark the end of this call's work on ``stream`` (not while capturing: a graph's work is ordered
        by its own launch stream)."""
        if self.driver.capturing(stream):
            self.st.joinable = 0
            return
        self.driver.event_record(ctypes.c_void_p(self._join_ev), ctypes.c_void_p(stream))
        self.st.joinable = 1

    # ----- one step ----------------------------------------------------------------------------------
    def step(self, stream: int, sends: Sequence[tuple], recvs: Sequence[tuple], label: str,
             consume: Callable[[int, tuple], None]) -> None:
        """Enqueue one exchange on ``stream``. sends: (peer, dev_ptr, nbytes); recvs: (peer, nbytes, ...)
        handed back with the staged data's device address to ``consume(addr, recv)`` after the wait."""
        d = self.driver
        s = ctypes.c_void_p(stream)
        total = sum(_align(n) for _, _, n in sends) + sum(_align(r[1]) for r in recvs)
        capturing = d.capturing(stream)
        rec = self.rec
        if rec is not None and capturing:
            rec.refuse("captured")
        if self.slice and not capturing and (any(n > self.slice for _, _, n in sends)
                                             or any(r[1] > self.slice for r in recvs)) \
                and _flat_recvs(recvs):
            return self._step_sliced(stream, sends, recvs, label, consume, total)
        if capturing:
            area = _Pinned(d, total)
            self._graph.append(area)
        else:
            area = self.staging(total)
        # eager messages go out in the same slices, on the same lanes, as on the pipelined path (one batch
        # here), so the peers' per-lane tag sequences agree whichever path each side took; a captured step
        # puts a piece on each lane (a template per lane)
        cut = self._lane_pieces if capturing else self._cut
        nl = len(self.engs)
        ops, off = [], 0
        for peer, ptr, n in sends:
            if n:
                rc = d.memcpy_dtoh(ctypes.c_void_p(area.host + off), ptr, n, s)
                if rc:
                    raise self._cuda("cuMemcpyDtoHAsync", rc)
                if rec is not None:
                    rec.copy(0, area.host + off, ptr, n, stream)
            ops.extend((i % nl, (0, peer, area.host + off + o, ln)) for i, (o, ln) in enumerate(cut(n)))
            off += _align(n)
        places = []
        for r in recvs:
            ops.extend((i % nl, (1, r[0], area.host + off + o, ln)) for i, (o, ln) in enumerate(cut(r[1])))
            places.append(area.dev + off)
            off += _align(r[1])
        if capturing:
            rc = self._capture(s, ops, label)
            self.captured += 1
        else:
            rc = self._wait(s, self._post(s, ops, label))
        if rc:
            raise self._cuda("cuStreamWaitValue32", rc)
        self.steps += 1
        for addr, r in zip(places, recvs):
            if r[1]:
                consume(addr, r)

    def _capture(self, s: Any, ops: list, label: str) -> int:
        """A captured step: a template per lane that has messages, each with a done and an arm word of its
        own. Each replay clears every done word, then sets every arm word (the lanes' engines, polling them,
        clear them and post their messages), then waits for every done word; the writes reach the host in
        stream order, after the staged data. The first failing driver call's code, else 0."""
        d = self.driver
        words = []
        for j in sorted({lane for lane, _op in ops}) or [0]:
            (done_h, done_d), (arm_h, arm_d) = self._graph_word(), self._graph_word()
            t = self.engs[j].template([op for lane, op in ops if lane == j], done_h, arm_h, self.timeout, label)
            self._graph.append(t)
            self._armed.append((arm_h, done_h))
            words.append((done_d, arm_d))
        for done_d, arm_d in words:
            rc = d.write_value32(s, done_d, 0, 0) or d.write_value32(s, arm_d, 1, 0)
            if rc:
                raise self._cuda("cuStreamWriteValue32", rc)
        for done_d, _arm_d in words:
            rc = d.wait_value32(s, done_d, 1, WAIT_GEQ)
            if rc:
                return rc
        return 0

    def _post(self, s: Any, ops: list, label: str, by_kernel: bool = False) -> List[tuple]:
        """Write the next ready token on the stream (``by_kernel``: the step's kernel writes it) and hand
        ``ops`` ((lane, op) pairs) to the engines, an eager batch per lane that has any (lane 0 when none
        has); returns the (lane, done value) pairs the stream then waits for."""
        st = self.st
        st.tok = (st.tok + 1) & 0xFFFFFFFF
        tok = st.tok
        if not by_kernel:
            rc = self.driver.write_value32(s, self.ready_d, tok, 0)
            if rc:
                raise self._cuda("cuStreamWriteValue32", rc)
        rec = self.rec
        if rec is not None:
            rec.token(s.value or 0, by_kernel)
        gate = self.gate() if self.gate is not None else 0
        lanes = sorted({lane for lane, _op in ops}) or [0]
        out = []
        for j in lanes:
            mine = [op for lane, op in ops if lane == j]
            st.val[j] = val = (st.val[j] + 1) & 0xFFFFFFFF
            self.engs[j].staged(mine, self.ready_h, tok, self.dones[j][0], val, self.timeout, label, gate)
            if rec is not None:
                rec.post(mine, j, val, gate, s.value or 0)
            out.append((j, val))
        return out

    def step_piped(self, stream: int, send: Optional[tuple], recv: Optional[tuple], label: str,
                   launch: Callable[..., tuple]) -> None:
        """One exchange of one message each way as one kernel walking its pieces (hp_net_pipe): piece i goes
        on lane i mod L as a batch of its own, gated on token t0 + i, which the kernel writes once piece i is
        staged, and the kernel combines piece i once lane i mod L's done word reaches v0 + i / L. The pieces
        and lanes are those of the other paths (a peer that takes another path posts the same messages).
        ``launch(send_stage, recv_stage, geom, lanes, tokval, words)`` enqueues the kernel and returns
        (func, grid, block, args) for the recording."""
        ns, nr = _sizes(send, recv)
        area = self.staging(_align(ns) + _align(nr))
        sp = self._cut(ns) if send is not None else []
        rp = self._cut(nr) if recv is not None else []
        k, nl = max(len(sp), len(rp)), len(self.engs)
        s = ctypes.c_void_p(stream)
        self._sync_vals(min(k, nl), stream)
        first = None
        rec, self.rec = self.rec, None  # a replay hands the pieces over per lane (rec.pipe), not one by one
        try:
            for i in range(k):
                ops = []
                if i < len(sp):
                    ops.append((i % nl, (0, send[0], area.host + sp[i][0], sp[i][1])))
                if i < len(rp):
                    ops.append((i % nl, (1, recv[0], area.host + _align(ns) + rp[i][0], rp[i][1])))
                posted = self._post(s, ops, label, by_kernel=True)
                first = first or posted[0]
        finally:
            self.rec = rec
        lane, val = first
        if rec is not None:
            piece = lambda p: max(p[0][1], 1) if p else 0  # noqa: E731 - every piece but the last is as long
            rec.pipe(k, nl, (send[0] if send is not None else -1, area.host, len(sp), piece(sp), ns),
                     (recv[0] if recv is not None else -1, area.host + _align(ns), len(rp), piece(rp), nr),
                     val, self.gate() if self.gate is not None else 0, stream)
        geom = (sp[0][1] if len(sp) > 1 else max(ns, 1)) | (rp[0][1] if len(rp) > 1 else max(nr, 1)) << 32
        func, grid, block, args = launch(area.dev, area.dev + _align(ns), geom, nl | k << 32,
                                         self.st.tok | (val << 32), self.ready_d)
        if self.rec is not None:
            self.rec.fused(func, grid, block, args, lane, val, stream)
        self.steps += 1
        self.piped += 1

    def _sync_vals(self, n: int, stream: int) -> None:
        """Lanes [0, n) take the done value furthest ahead among them, so a piped step's piece i waits for
        v0 + i / L on lane i mod L (a lane's done word only goes up, in post order)."""
        v = self.st.val
        m = v[0]
        for j in range(1, n):
            if 0 < ((v[j] - m) & 0xFFFFFFFF) < (1 << 31):
                m = v[j]
        for j in range(n):
            v[j] = m
        if self.rec is not None:
            self.rec.sync(n, stream)

    def step_fused(self, stream: int, send: Optional[tuple], recv: Optional[tuple], label: str,
                   launch: Callable[..., tuple]) -> None:
        """One small exchange as one kernel on ``stream``: the engine is handed the step's messages now,
        gated on the token the kernel writes once it has staged the send; ``launch(send_stage, recv_stage,
        tokval, words)`` enqueues the kernel (it waits for the done word and combines what arrived) and
        returns (func, grid, block, args) for the recording."""
        ns, nr = _sizes(send, recv)
        area = self.staging(_align(ns) + _align(nr))
        s = ctypes.c_void_p(stream)
        (lane, val), = self._post(s, [(0, m) for m in _messages(send, recv, area.host)], label, by_kernel=True)
        func, grid, block, args = launch(area.dev, area.dev + _align(ns), self.st.tok | (val << 32), self.ready_d)
        if self.rec is not None:
            self.rec.fused(func, grid, block, args, lane, val, stream)
        self.steps += 1
        self.fused += 1

    def capture_fused(self, stream: int, send: Optional[tuple], recv: Optional[tuple], label: str,
                      launch: Callable[..., tuple]) -> None:
        """step_fused on a capturing stream: a template on lane 0 with an arm word and the done word after
        it, and staging of its own; the kernel (captured) clears the done word, sets the arm word once the
        send is staged, and waits for the engine's done := 1 at every replay."""
        ns, nr = _sizes(send, recv)
        area = _Pinned(self.driver, _align(ns) + _align(nr))
        self._graph.append(area)
        ops = _messages(send, recv, area.host)
        if self.rec is not None:
            self.rec.refuse("captured")
        arm_h, arm_d = self._graph_word(5)  # arm, done, the wait's limit (2 words), stuck: the kernel's words
        _put_limit(arm_h + 8, self.kernel_limit)
        page = self._gwords
        if page.host not in self._cstuck:
            import numpy as np
            self._cstuck[page.host] = (np.ctypeslib.as_array((ctypes.c_uint32 * _WORDS).from_address(page.host)), [])
        idx = self._cstuck[page.host][1]
        idx.append((arm_h + 16 - page.host) // 4)
        self._cidx = None  # gave_up() gathers the stuck words again
        t = self.engs[0].template(ops, arm_h + 4, arm_h, self.timeout, label)
        self._graph.append(t)
        self._armed.append((arm_h, arm_h + 4))
        launch(area.dev, area.dev + _align(ns), 1 | (1 << 32), arm_d, True)
        self.steps += 1
        self.captured += 1
        self.fused += 1

    def _wait(self, s: Any, posted: List[tuple]) -> int:
        """The stream waits until every lane's batch of one post has ended; the first failing driver
        call's code, else 0."""
        for j, val in posted:
            rc = self.driver.wait_value32(s, self.dones[j][1], val, WAIT_GEQ)
            if rc:
                return rc
            if self.rec is not None:
                self.rec.wait(j, val, s.value or 0)
        return 0

    def _step_sliced(self, stream: int, sends: Sequence[tuple], recvs: Sequence[tuple], label: str,
                     consume: Callable[[int, tuple], None], total: int) -> None:
        """One eager exchange as a batch per slice, software-pipelined on the stream: the device-to-host
        copies of the next max(2, lanes) - 1 slices are enqueued before the wait for slice i, so that many
        slices are on the wire at once (one per lane) while slice i is copied out or reduced. Slices occupy
        disjoint parts of the staging area, so no slice's data is overwritten while the engine or the GPU
        still reads it."""
        d = self.driver
        s = ctypes.c_void_p(stream)
        area = self.staging(total)
        off, sp, rp = 0, [], []
        for peer, ptr, n in sends:
            sp.append((peer, ptr, area.host + off, self._pieces(n)))
            off += _align(n)
        for r in recvs:
            rp.append((r, area.host + off, area.dev + off, self._pieces(r[1])))
            off += _align(r[1])
        k = max(len(x[3]) for x in sp + rp)
        nl = len(self.engs)
        depth = max(2, nl)
        pending: List[tuple] = []
        for i in range(k):
            ops, mine = [], []
            for peer, ptr, host, pieces in sp:
                if i < len(pieces):
                    o, ln = pieces[i]
                    if ln:
                        rc = d.memcpy_dtoh(ctypes.c_void_p(host + o), ptr + o, ln, s)
                        if rc:
                            raise self._cuda("cuMemcpyDtoHAsync", rc)
                        if self.rec is not None:
                            self.rec.copy(0, host + o, ptr + o, ln, stream)
                    ops.append((i % nl, (0, peer, host + o, ln)))
            for r, host, dev, pieces in rp:
                if i < len(pieces):
                    o, ln = pieces[i]
                    ops.append((i % nl, (1, r[0], host + o, ln)))
                    mine.append((dev + o, r, o, ln))
            pending.append((self._post(s, ops, label), mine))
            if len(pending) >= depth:
                self._slice_out(s, pending.pop(0), consume)
        for p in pending:
            self._slice_out(s, p, consume)
        self.steps += 1

    def _slice_out(self, s: Any, pending: tuple, consume: Callable[[int, tuple], None]) -> None:
        """Wait on the stream for one slice's batch, then hand each received piece to ``consume`` as a
        receive of its own (the buffer and source viewed at the piece's elements)."""
        posted, mine = pending
        rc = self._wait(s, posted)
        if rc:
            raise self._cuda("cuStreamWaitValue32", rc)
        for addr, r, o, ln in mine:
            if ln:
                consume(addr, _piece_of(r, o, ln))

    def _cuda(self, what: str, rc: int) -> HpcclError:
        from ..errors import HpcclSystemError
        return HpcclSystemError(f"{what} failed while enqueuing a network step: {self.driver.error_name(rc)}")

    # ----- failures and life cycle -------------------------------------------------------------------
    def pending(self) -> bool:
        """Whether an eager step handed to the engine has not ended yet (its done word is behind)."""
        for j, (h, _d) in enumerate(self.dones):
            done = ctypes.c_uint32.from_address(h).value
            if 0 < ((self.st.val[j] - done) & 0xFFFFFFFF) < (1 << 31):
                return True
        return False

    def gave_up(self) -> bool:
        """Whether a network kernel's wait for the engine gave up (a stuck word is set)."""
        if ctypes.c_uint32.from_address(self.stuck_h).value:
            return True
        if not self._cstuck:
            return False
        if self._cidx is None:  # per page, its captured kernels' stuck words as one index array (made once)
            import numpy as np
            self._cidx = [(words, np.array(idx, dtype=np.intp)) for words, idx in self._cstuck.values()]
        return any(words[at].any() for words, at in self._cidx)

    def error(self) -> Optional[HpcclError]:
        if self.gave_up():
            from ..errors import HpcclSystemError
            if ctypes.c_uint32.from_address(self.stuck_h).value == STUCK_WATCH:
                return HpcclSystemError(
                    f"this rank's network engine made no progress for {limit_s(self.timeout):g}s (2 x HPCCL_TIMEOUT"
                    f" + 10 s): the watchdog released its GPU steps' stream waits; their data is not whole")
            return HpcclSystemError(
                f"a GPU network step's kernel waited {self.kernel_limit / 1e9:g}s (2 x HPCCL_TIMEOUT + 5 s) for "
                f"this rank's network engine and gave up: the engine stopped writing its done words; the step's "
                f"data is not whole")
        e = next((x for x in (eng.error() for eng in self.engs) if x is not None), None)
        if e is None:
            return None
        return step_error(e, None if self.transport is None else self.transport._failed)

    def close(self) -> None:
        """After the engine's last step ended (the caller synchronized the device or the engine closed). An
        engine that stopped (a kernel gave up on it, or a step is still behind) may yet write its steps' done
        words and staging when it is closed, and a failed step's sends UCX could not cancel (``lingering``)
        may yet read its staging: their memory is then kept until the process ends, not freed."""
        _NETS.discard(self)
        w = getattr(self, "_watch", None)
        if w is not None:
            w.close()
        for t in self._graph:
            if not isinstance(t, _Pinned):
                t.retire()  # the engine stops reading its arm word before the word's memory is freed
        graph = [g for g in self._graph if isinstance(g, _Pinned)]
        if self._armed:  # a graph may still be replayed: its words and staging stay, answered by ORPHANS
            ORPHANS.adopt(self._armed, graph)
            graph = []
        mem = [p for p in [self._words, self._stage, *self._old, *graph] if p is not None]
        if self.pending() or self.gave_up() or any(e.lingering for e in self.engs):
            ORPHANS.keep(mem)
        else:
            for p in mem:
                p.free()
        self._graph, self._old, self._stage, self._armed = [], [], None, []
        if self._join_ev:
            self.driver.event_destroy(ctypes.c_void_p(self._join_ev))
            self._join_ev = 0


_LABEL = re.compile(r"^(?P<coll>[a-z_]+) #(?P<seq>\d+)(?:, (?P<step>step \d+ \(.+?\)))?: (?P<err>.*)$", re.S)
_WAITING = re.compile(r"timed out after (?P<s>[\d.]+)s waiting for rank\(s\) \[(?P<ranks>[\d, ]*)\]")


def step_error(args: tuple, failed: Optional[Callable[[int, tuple], HpcclError]] = None) -> HpcclError:
    """The error of a failed step from the engine's (code, peer, "label: message"): a timeout as
    HpcclTimeoutError naming the ranks the step waited for, an abort or a lost peer as the transport names it
    (``failed``: EngineTransport._failed, which knows who an abort named); every rank in the communicator's
    wire numbering (hpccl/runtime/failures.py maps them once). The label, the recorder's name of the call (and of the
    hier step: "all_reduce #6, step 2 (inter all_reduce)"), gives the user's call it failed in (in_call)."""
    from ..transport.engine import _ne, engine_error
    code, peer, msg = args
    m = _LABEL.match(msg)
    exc: Optional[HpcclError] = None
    if code == _ne.E_TIMEOUT and m is not None:
        w = _WAITING.search(m.group("err"))
        if w is not None:
            missing = [int(x) for x in w.group("ranks").split(",") if x.strip()]
            exc = HpcclTimeoutError(m.group("coll"), int(m.group("seq")), missing, float(w.group("s")),
                                    "a GPU network step")
    if exc is None:
        exc = failed(peer, args) if failed is not None else engine_error(args)
    if m is not None and m.group("step"):
        exc.in_call = (m.group("coll"), int(m.group("seq")), m.group("step"))
    return exc
