"""Repeated GPU calls across nodes enqueued by one C call (HPCCL_NET_REPLAY).

The first call of a key (collective, buffers, dtype, op, root, stream) runs in Python on the staged network
path (hpccl/gpu/netstep.py) and is recorded as the stream work it enqueues: copies to and from pinned staging
memory, kernel launches, and each network step (ready token, the step's messages, the wait for its done
word). The next calls of that key replay the recording in hpccl/csrc/_netreplay.c: the same driver calls and the
same messages handed to the engine in the same order, so the per-peer tags agree with a peer that runs the
Python path. A call whose recording saw anything it cannot replay (a capture, another stream, an input
copied aside) is not kept, and runs in Python every time.

What the recordings point into (the staging areas, scratch buffers) is kept alive with them; every
recording goes when the planner drops its plans (HPCCL_ALGO forced, a buffer registered) or the
communicator ends.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional

from .. import config
from ..errors import HpcclSystemError

MAX_PROGRAMS = 256  # recorded calls kept per communicator (all go when there are more)


class Recording:
    """The stream work of one GPU network call, in the order it was enqueued (actions _netreplay.c knows)."""

    __slots__ = ("stream", "acts", "msgs", "keep", "why", "gate", "_posts")

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.acts: List[tuple] = []
        self.msgs: List[tuple] = []
        self.keep: List[Any] = []
        self.why: Optional[str] = None
        self.gate: Optional[int] = None
        self._posts: Dict[tuple, int] = {}  # (lane, done value) -> index of the post that hands it out

    def refuse(self, why: str) -> None:
        """This call cannot be replayed (the first reason is kept, for the log)."""
        if self.why is None:
            self.why = why

    def _on(self, stream: int) -> bool:
        if stream != self.stream:
            self.refuse("work on another stream")
            return False
        return True

    def copy(self, kind: int, dst: int, src: int, n: int, stream: int) -> None:
        """kind 0: device to host, 1: host to device, 2: device to device."""
        if self._on(stream):
            self.acts.append((kind, dst, src, n))

    def token(self, stream: int, by_kernel: bool = False) -> None:
        """The next ready token, written on the stream (or by the step's fused kernel: ``by_kernel``); every
        lane's batch of the step waits for it."""
        if self._on(stream):
            self.acts.append((7 if by_kernel else 6, 0))

    def post(self, ops: List[tuple], lane: int, val: int, gate: int, stream: int) -> None:
        """One lane's batch of a step, handed over at the last token."""
        if not self._on(stream):
            return
        if self.gate is not None and gate != self.gate:
            self.refuse("steps with different gates")
        self.gate = gate
        self._posts[(lane, val)] = len(self._posts)
        self.acts.append((3, len(ops), lane))
        self.msgs.extend(ops)

    def pipe(self, k: int, lanes: int, send: tuple, recv: tuple, v0: int, gate: int, stream: int) -> None:
        """A piped step's k pieces over ``lanes`` lanes (piece i on lane i mod lanes, token t0 + i, done value
        v0 + i / lanes): send and recv are (peer or -1, staging address, pieces, piece bytes, bytes). Replayed
        as one hand-over per lane, whose engine makes the pieces' batches (A_PIPE); counts as the post of
        (lane 0, v0), the first piece, for the step's kernel."""
        if not self._on(stream):
            return
        if self.gate is not None and gate != self.gate:
            self.refuse("steps with different gates")
        self.gate = gate
        self._posts[(0, v0)] = len(self._posts)
        (sp, sa, ks, ps, ns), (rp, ra, kr, pr, nr) = send, recv
        self.acts.append((10, k, lanes, sp, sa, ks, ps, ns, rp, ra, kr, pr, nr))

    def wait(self, lane: int, val: int, stream: int) -> None:
        if self._on(stream):
            k = self._posts.get((lane, val))
            if k is None:
                self.refuse("a wait for a step of another call")
            else:
                self.acts.append((4, k))

    def sync(self, lanes: int, stream: int) -> None:
        """Lanes [0, lanes) take the done value furthest ahead among them (a piped step's pieces are numbered
        from one value on every lane)."""
        if self._on(stream):
            self.acts.append((9, lanes))

    def fused(self, func: int, grid: int, block: int, args: tuple, lane: int, val: int, stream: int) -> None:
        """A fused or piped step's kernel: its last argument is patched at each replay with the latest token
        and the done value of the post (lane, val) it waits for first."""
        if self._on(stream):
            k = self._posts.get((lane, val))
            if k is None or len(args) not in (8, 10):
                self.refuse("a fused step without its post")
            else:
                self.acts.append((8, func, grid, block, tuple(int(a) & 0xFFFFFFFFFFFFFFFF for a in args), k))

    def launch(self, func: int, grid: int, block: int, args: tuple, stream: int) -> None:
        if self._on(stream):
            if len(args) > 10:
                self.refuse("a kernel with more than 10 arguments")
            else:
                self.acts.append((5, func, grid, block, tuple(int(a) & 0xFFFFFFFFFFFFFFFF for a in args)))


class NetReplays:
    """The recorded calls of one communicator's staged network path, and their replay."""

    def __init__(self, net: Any, mem: Any, fns: Optional[tuple] = None) -> None:
        self.net, self.mem = net, mem  # netstep.StagedNet, the primitives' DeviceMemory
        if fns is None:  # the CUDA driver's (a test passes stand-ins, in the same order)
            from ..kernels import Driver
            d = Driver.get()
            fns = tuple(Driver.address(f) for f in (
                d.memcpy_dtoh, d.memcpy_htod, d.memcpy_async, d.write_value32, d.wait_value32, d.launch_fn,
                d._is_capturing, d.event_record, d.stream_wait_event))
        self._fns = fns
        self._progs: Dict[tuple, Any] = {}
        self._refused: Dict[tuple, str] = {}
        self._replayed = 0
        self.door: Any = None  # a NetDoor (door()) the recordings are also handed to, with their byte counts
        self.nranks = 1

    @property
    def replayed(self) -> int:
        """Calls replayed, by fire() and through the door."""
        return self._replayed + (self.door.fired if self.door is not None else 0)

    def fire(self, key: tuple, label: str) -> int:
        """Replay the call recorded under ``key``: 0 enqueued, -1 none recorded, 1 the stream is capturing,
        2 the engine failed or closed (nothing enqueued in the last two: the Python path runs and reports)."""
        p = self._progs.get(key)
        if p is None:
            return -1
        try:
            rc = p.run(key[-1], label)
        except RuntimeError as exc:
            raise HpcclSystemError(str(exc)) from None
        if rc == 0:
            self._replayed += 1
        return rc

    def start(self, key: Any, stream: int) -> Optional[Recording]:
        """A recording for this call (None when ``key`` is None or was refused before)."""
        if key is None or key in self._progs or key in self._refused or self.net.rec is not None:
            return None
        rec = Recording(stream)
        self.net.rec = self.mem.rec = rec
        return rec

    def finish(self, key: Any, rec: Optional[Recording], ok: bool) -> None:
        """Keep ``rec`` for replays of ``key`` when the call enqueued everything and nothing was refused."""
        if rec is None:
            return
        self.net.rec = self.mem.rec = None
        if not ok:
            return
        if rec.why == "captured":  # the same call made eagerly later is recorded then
            return
        if rec.why is not None or not rec.acts:
            self._refused[key] = rec.why or "nothing enqueued"
            return
        if len(self._progs) >= MAX_PROGRAMS:
            self.drop()
        net = self.net
        lanes = tuple((e, h, d) for e, (h, d) in zip(net.engs, net.dones))
        prog = self._progs[key] = net.eng.program(
            rec.acts, rec.msgs, self._fns, (net.ready_h, net.ready_d, net.stuck_h), lanes,
            ctypes.addressof(net.st), net._join_ev, net.timeout, rec.gate or 0, rec.keep)
        if self.door is not None and key[0] in CODES:
            coll, ks, kr, op, root, st = key
            nbytes = ks[1] * ks[2].itemsize * (self.nranks if coll == "ag" else 1)
            self.door.put(CODES[coll], ks, kr, op, root, st, prog, nbytes)

    def drop(self) -> None:
        """Forget every recording (the planner dropped its plans, or the communicator ends)."""
        self._progs.clear()
        self._refused.clear()
        if self.door is not None:
            self.door.drop()

    def __len__(self) -> int:
        return len(self._progs)


def enabled() -> bool:
    return bool(config.get("HPCCL_NET_REPLAY"))


CODES = {"ar": 0, "red": 1, "bc": 2, "ag": 3, "rs": 4, "a2a": 5}  # the door's collective numbers (_netdoor.c)
NAMES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")


def _detail(d: Any, kind: str, latency: bool) -> List[tuple]:
    """The door's rows for metrics: (path "replayed", collective, kind, "replayed", calls, bytes, seconds,
    latency buckets or None)."""
    hists = d.histograms() if latency else {}
    return [("replayed", c, k, a, n, b, t, hists.get(c)) for c, k, a, n, b, t in d.rows(kind)]


def door(comm: Any, replays: NetReplays, keys: Any) -> Any:
    """The C front door (hpccl/csrc/_netdoor.c) for ``comm``'s replayed calls: handed every recording of
    ``replays``, reading arrays as ``keys`` (memory/cuda.py CallKeys) does, counted in comm's statistics.
    None when HPCCL_NET_DOOR is off, the engine lacks it, or comm's calls are checked or traced (their Python
    path does more per call). hier's network sub-communicator gets one too: only hier's chains
    (gpu/hierreplay.py) call it by its public calls, which the door serves as _net_fire would."""
    from ..observe.recorder import Recorder
    if not config.get("HPCCL_NET_DOOR") or comm._check_calls or comm._observed or not isinstance(comm._rec, Recorder):
        return None
    from ..transport.engine import _ne
    if _ne is None or not hasattr(_ne, "NetDoor"):
        return None
    import sys
    from ..errors import HpcclSystemError
    from ..memory.interop import CUDA
    torch = sys.modules.get("torch")
    tt, tst = (), None
    if torch is not None and hasattr(torch, "nn"):
        tt = (torch.Tensor, torch.nn.Parameter)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what stream_handle reads, without objects
        tst = ((lambda t: raw(t.get_device())) if raw is not None else
               (lambda t: int(torch.cuda.current_stream(t.device).cuda_stream)))
    d = _ne.NetDoor(comm, keys._cp_nd, keys._cp_contig, keys._cur_stream, tt, NAMES, HpcclSystemError,
                    torch_stream=tst)
    replays.door, replays.nranks = d, comm.size
    stats = comm._rec.stats
    d.latency = int(stats.latency)
    stats.attach(lambda: d.rows(CUDA), lambda: _detail(d, CUDA, stats.latency))
    return d
