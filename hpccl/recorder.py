"""The flight recorder: each communicator keeps its last HPCCL_RECORD_CALLS calls (sequence, collective,
bytes, memory kind, algorithm, start and end times, state) and, when HPCCL_DUMP_DIR is set, writes them as
one JSON file per rank on a timeout, an abort or SIGUSR1; ``hpccl-info --analyze DIR`` reads every rank's
file and says which ranks stopped at which call. It works without torch or a GPU."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import weakref
from typing import Any, Dict, List, Optional

from . import config, log
from .stats import Stats
from .trace import open_trace

# one record: [seq, collective, bytes, memory kind, algorithm, start, end, state]
_SEQ, _COLL, _BYTES, _KIND, _ALGO, _START, _END, _STATE = range(8)
_live: "weakref.WeakSet[Recorder]" = weakref.WeakSet()
_handler_lock = threading.Lock()
_handler_installed = False


class Recorder:
    """A ring of the last calls of one communicator; ``tag`` names the communicator in the dump."""

    def __init__(self, tag: str, rank: int, size: int, world_rank: int) -> None:
        self.tag, self.rank, self.size, self.world_rank = tag, rank, size, world_rank
        self.n = max(1, config.get("HPCCL_RECORD_CALLS"))
        self.ring: List[Optional[list]] = [None] * self.n
        self.current: Optional[list] = None
        self.dump_dir = config.get("HPCCL_DUMP_DIR")
        self.dumped: Optional[str] = None
        self.stats = Stats()  # every finished call is counted (comm.stats())
        trace_dir = config.get("HPCCL_TRACE")
        self.trace = open_trace(trace_dir, tag, rank, size, world_rank) if trace_dir else None
        self.nvtx: Any = None  # the nvtx module while GPU calls are ranged (set by the communicator)
        if self.dump_dir:
            _live.add(self)
            _install_sigusr1()

    def start(self, seq: int, coll: str, nbytes: int, kind: str) -> list:
        rec = [seq, coll, nbytes, kind, "", time.time(), 0.0, "running"]
        self.ring[seq % self.n] = rec
        self.current = rec
        return rec

    def algo(self, name: str) -> None:
        if self.current is not None:
            self.current[_ALGO] = name
            if self.nvtx is not None and self.current[_KIND] != "host":
                self.nvtx.mark(f"algorithm {name}", domain="hpccl")

    def end(self, rec: list, state: str) -> None:
        rec[_END], rec[_STATE] = time.time(), state
        if rec[_ALGO] != "hot":  # the hot path counts its calls itself (hpccl/_hotpath.c)
            self.stats.add(rec[_COLL], rec[_KIND], rec[_ALGO], rec[_BYTES], rec[_END] - rec[_START])
        if self.trace is not None:
            self.trace.call(rec[_COLL], rec[_SEQ], rec[_BYTES], rec[_KIND], rec[_ALGO], rec[_START], rec[_END],
                            state)

    def calls(self) -> List[dict]:
        keys = ("seq", "collective", "bytes", "memory", "algorithm", "start", "end", "state")
        recs = sorted((r for r in self.ring if r is not None), key=lambda r: r[_SEQ])
        return [dict(zip(keys, r)) for r in recs]

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
