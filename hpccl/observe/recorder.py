"""The flight recorder: each communicator keeps its last HPCCL_RECORD_CALLS calls (sequence, collective,
bytes, memory kind, algorithm, start and end times, state, and the steps of a composite call) and, when
HPCCL_DUMP_DIR is set, writes them as one JSON file per rank on a timeout, an abort or SIGUSR1;
``hpccl-info --analyze DIR`` reads every rank's file and says which ranks stopped at which call (and in
which step). It works without torch or a GPU.

A user's call is one record, one trace event, one stats count and one NVTX range of the communicator it
was made on. The sub-communicators that run hier's steps (intra, inter) record nothing of their own: their
StepRecorder adds each call as a step of the user's call that is running (in its record, as a child event
in its trace, as a step row under its stats row, as an NVTX range in the domain "hpccl.steps")."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

from .. import config, log
from . import metrics
from .stats import Stats
from .trace import open_trace

# one record: [seq, collective, bytes, memory kind, algorithm, start, end, state, steps (None or a list)]
_SEQ, _COLL, _BYTES, _KIND, _ALGO, _START, _END, _STATE, _STEPS = range(9)
# one step: [step number in its call (1, 2, ...), sub-communicator ('intra'/'inter'), collective, bytes,
# memory kind, algorithm, start, end, state]
_K, _WHERE, _SCOLL, _SBYTES, _SKIND, _SALGO, _SSTART, _SEND, _SSTATE = range(9)
DOMAIN, STEP_DOMAIN = "hpccl", "hpccl.steps"  # NVTX: the user's calls; the steps inside them
_live: "weakref.WeakSet[Recorder]" = weakref.WeakSet()
_handler_lock = threading.Lock()
_handler_installed = False


class Recorder:
    """A ring of the last calls of one communicator; ``tag`` names the communicator in the dump."""

    domain = DOMAIN  # the NVTX domain of its calls' ranges

    def __init__(self, tag: str, rank: int, size: int, world_rank: int) -> None:
        self.tag, self.rank, self.size, self.world_rank = tag, rank, size, world_rank
        self.n = max(1, config.get("HPCCL_RECORD_CALLS"))
        self.ring: List[Optional[list]] = [None] * self.n
        self.current: Optional[list] = None
        self.dump_dir = config.get("HPCCL_DUMP_DIR")
        self.dumped: Optional[str] = None
        self.stats = Stats(metrics.active())  # every finished call is counted (comm.stats(), metrics)
        if self.stats.latency:
            metrics.watch(self)
        trace_dir = config.get("HPCCL_TRACE")
        self.trace = open_trace(trace_dir, tag, rank, size, world_rank) if trace_dir else None
        self.nvtx: Any = None  # the nvtx module while GPU calls are ranged (set by the communicator)
        if self.dump_dir:
            _live.add(self)
            _install_sigusr1()

    def start(self, seq: int, coll: str, nbytes: int, kind: str) -> list:
        rec = [seq, coll, nbytes, kind, "", time.time(), 0.0, "running", None]
        self.ring[seq % self.n] = rec
        self.current = rec
        return rec

    def label(self, rec: list) -> str:
        """The NVTX range of a call."""
        return f"hpccl {rec[_COLL]} #{rec[_SEQ]} {rec[_BYTES]} B"

    def algo(self, name: str) -> None:
        if self.current is not None:
            self.current[_ALGO] = name
            if self.nvtx is not None and self.current[_KIND] != "host":
                self.nvtx.mark(f"algorithm {name}", domain=DOMAIN)

    def end(self, rec: list, state: str) -> None:
        rec[_END], rec[_STATE] = time.time(), state
        if rec[_ALGO] != "hot":  # the hot path counts its calls itself (hpccl/csrc/_hotcore.c)
            self.stats.add(rec[_COLL], rec[_KIND], rec[_ALGO], rec[_BYTES], rec[_END] - rec[_START])
        if self.trace is not None:
            self.trace.call(rec[_COLL], rec[_SEQ], rec[_BYTES], rec[_KIND], rec[_ALGO], rec[_START], rec[_END],
                            state, rec[_STEPS])

    def step(self) -> Optional[str]:
        """The step the running call is in (its last), e.g. "step 2 (inter all_reduce)", or None: for the
        error that names the user's call."""
        rec = self.current
        if rec is None or not rec[_STEPS]:
            return None
        s = rec[_STEPS][-1]
        return f"step {s[_K]} ({s[_WHERE]} {s[_SCOLL]})"

    def name(self, coll: str, seq: int) -> str:
        """How messages (the network proxy's) name this communicator's call ``coll`` #``seq``."""
        return f"{coll} #{seq}"

    def at(self) -> Optional[Tuple[str, int, str]]:
        """For a step's call: (the user's collective, its sequence number, "step k (where collective)")."""
        return None

    def calls(self) -> List[dict]:
        keys = ("seq", "collective", "bytes", "memory", "algorithm", "start", "end", "state")
        recs = sorted((r for r in self.ring if r is not None), key=lambda r: r[_SEQ])
        return [dict(zip(keys, r), steps=[dict(zip(_STEP_KEYS, s)) for s in r[_STEPS] or ()]) for r in recs]

    def dump(self, reason: str) -> Optional[str]:
        """Write this rank's file (atomically) to HPCCL_DUMP_DIR; returns its path, None when unset."""
        if not self.dump_dir:
            return None
        os.makedirs(self.dump_dir, exist_ok=True)
        path = os.path.join(self.dump_dir, f"hpccl-{self.tag}-rank{self.rank}.json")
        body = dict(tag=self.tag, rank=self.rank, size=self.size, world_rank=self.world_rank,
                    host=socket.gethostname(), pid=os.getpid(), reason=reason, time=time.time(),
                    calls=self.calls())
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(body, f)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log.warn("INIT", "flight recorder: cannot write %s: %s", path, exc)
            return None
        self.dumped = path
        return path


_STEP_KEYS = ("step", "communicator", "collective", "bytes", "memory", "algorithm", "start", "end", "state")


class StepRecorder(Recorder):
    """The recorder of a sub-communicator whose calls are steps of its parent's calls (hier's intra and
    inter): each call becomes a step of the call its parent's recorder (the user's communicator's) is
    running. No ring, dump, trace file or stats table of its own: nothing outside the user's call."""

    domain = STEP_DOMAIN

    def __init__(self, parent: Recorder, where: str, tag: str, rank: int, size: int, world_rank: int) -> None:
        self.tag, self.rank, self.size, self.world_rank = tag, rank, size, world_rank
        self.top: Recorder = parent.top if isinstance(parent, StepRecorder) else parent
        self.where = where
        self.n, self.ring, self.current = 1, [None], None
        self.dump_dir, self.dumped, self.trace = "", None, None
        self.stats = Stats()  # only for the compiled path's C counters, which the sub-communicator attaches
        self.nvtx = None

    def start(self, seq: int, coll: str, nbytes: int, kind: str) -> list:
        call = self.top.current
        step = [1, self.where, coll, nbytes, kind, "", time.time(), 0.0, "running"]
        if call is not None and call[_STATE] == "running":
            if call[_STEPS] is None:
                call[_STEPS] = [step]
            else:
                step[_K] = len(call[_STEPS]) + 1
                call[_STEPS].append(step)
        self.current = step
        return step

    def label(self, step: list) -> str:
        call = self.top.current
        of = f" of {call[_COLL]} #{call[_SEQ]}" if call is not None else ""
        return f"hpccl step {step[_K]}{of}: {step[_WHERE]} {step[_SCOLL]} {step[_SBYTES]} B"

    def algo(self, name: str) -> None:
        step = self.current
        if step is not None:
            step[_SALGO] = name
            if self.nvtx is not None and step[_SKIND] != "host":
                self.nvtx.mark(f"algorithm {name}", domain=STEP_DOMAIN)

    def end(self, step: list, state: str) -> None:
        step[_SEND], step[_SSTATE] = time.time(), state
        call = self.top.current
        if call is not None and call[_STATE] == "running":
            self.top.stats.add_step(call[_COLL], call[_KIND], call[_ALGO], f"{step[_WHERE]} {step[_SCOLL]}",
                                    step[_SALGO], step[_SBYTES], step[_SEND] - step[_SSTART])

    def step(self) -> Optional[str]:
        return None

    def name(self, coll: str, seq: int) -> str:
        """The user's call, and this step of it."""
        call, step = self.top.current, self.current
        if call is None or step is None:
            return f"{coll} #{seq}"
        return f"{call[_COLL]} #{call[_SEQ]}, step {step[_K]} ({step[_WHERE]} {coll})"

    def at(self) -> Optional[Tuple[str, int, str]]:
        call, step = self.top.current, self.current
        if call is None or step is None:
            return None
        return call[_COLL], call[_SEQ], f"step {step[_K]} ({step[_WHERE]} {step[_SCOLL]})"

    def calls(self) -> List[dict]:
        return []

    def dump(self, reason: str) -> Optional[str]:
        return None  # the user's communicator's dump holds the steps


def _install_sigusr1() -> None:
    """SIGUSR1 dumps every live communicator of this process (main thread only, once)."""
    global _handler_installed
    with _handler_lock:
        if _handler_installed or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGUSR1)

        def on_usr1(signum: int, frame: Any) -> None:
            for rec in list(_live):
                rec.dump("SIGUSR1")
            if callable(previous):
                previous(signum, frame)
        signal.signal(signal.SIGUSR1, on_usr1)
        _handler_installed = True


def analyze(directory: str) -> List[str]:
    """Lines saying, per communicator found in ``directory``, where each rank stopped and which ranks
    never reached the call the others are in (the ranks to look at first)."""
    comms: Dict[str, List[dict]] = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("hpccl-") and name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                d = json.load(f)
            comms.setdefault(d["tag"], []).append(d)
    out: List[str] = []
    for tag, dumps in comms.items():
        size = dumps[0]["size"]
        out.append(f"communicator {tag}: {len(dumps)} of {size} ranks dumped")
        last: Dict[int, dict] = {}
        for d in sorted(dumps, key=lambda d: d["rank"]):
            calls = d["calls"]
            c = calls[-1] if calls else None
            last[d["rank"]] = c or {}
            where = f"{c['collective']} #{c['seq']} ({c['state']}, {c['bytes']} B {c['memory']}" + \
                (f", {c['algorithm']})" if c and c["algorithm"] else ")") if c else "no call"
            steps = (c or {}).get("steps") or []
            if steps and c["state"] not in ("done", "enqueued"):  # where a stuck or failed call was
                s = steps[-1]
                where += f", in step {s['step']} {s['communicator']} {s['collective']} ({s['state']})"
            out.append(f"  rank {d['rank']} ({d['host']}:{d['pid']}, dumped on {d['reason']}): last call {where}")
        missing = sorted(set(range(size)) - set(last))
        top = max((c.get("seq", 0) for c in last.values()), default=0)
        behind = sorted(r for r, c in last.items() if c.get("seq", 0) < top)
        if behind or missing:
            ahead = [r for r, c in last.items() if c.get("seq", 0) == top]
            name = next((c["collective"] for c in last.values() if c.get("seq") == top), "?")
            out.append(f"  => ranks {ahead} reached {name} #{top}"
                       + (f"; ranks {behind} stopped before it" if behind else "")
                       + (f"; ranks {missing} left no dump (dead, stopped, or HPCCL_DUMP_DIR unset there)"
                          if missing else ""))
        else:
            out.append(f"  => every rank reached call #{top}")
    return out or [f"no hpccl dumps in {directory}"]
