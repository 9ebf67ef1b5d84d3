"""HPCCL_TRACE: a Chrome-trace / Perfetto JSON file per rank and communicator, one complete event per call
(collective, bytes, algorithm, sequence, host start and duration; for GPU calls also an event on the GPU
track, timed by CUDA events on the caller's stream). The steps of a composite call (hier's calls on its
sub-communicators) are child events of the call's event: on the same track, inside its interval, category
"step", with the call's sequence number; the sub-communicators write no file of their own. The file is
valid JSON after every event (the closing brackets are rewritten behind each one), so the trace of a rank
that crashed is readable up to its last completed call. ``hpccl-trace merge`` puts every rank's file on
one timeline (hpccl/cli/trace.py)."""
from __future__ import annotations

import ctypes
import json
import os
import time
from typing import Any, List, Optional, Tuple

from .. import log

_TAIL = "\n]}\n"
_TAIL_B = _TAIL.encode()


class TraceFile:
    """One rank's trace of one communicator; events are appended, the file stays valid JSON."""

    def __init__(self, directory: str, tag: str, rank: int, size: int, world_rank: int) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"hpccl-trace-{tag}-rank{rank}.json")
        self.pid, self.tag = world_rank, tag
        self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        meta = {"tool": "hpccl", "communicator": tag, "rank": rank, "size": size, "world_rank": world_rank,
                "host": os.uname().nodename, "pid": os.getpid(), "clock_sync_us": _now_us()}
        head = ('{"displayTimeUnit": "ns", "otherData": ' + json.dumps(meta) + ', "traceEvents": [').encode()
        os.pwrite(self._fd, head + _TAIL.encode(), 0)
        self._pos = len(head)
        self._n = 0
        self._emit({"name": "process_name", "ph": "M", "pid": self.pid, "args": {"name": f"rank {world_rank}"}})
        for tid, name in ((0, f"hpccl {tag} (host)"), (1, f"hpccl {tag} (GPU)")):
            self._emit({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid, "args": {"name": name}})

    def _emit(self, ev: Any) -> None:
        """Append one event (a dict, or its JSON text) with one pwrite: the event and the closing brackets
        after it, written over the previous closing brackets, so the file is valid JSON after each call."""
        if self._fd is None:
            return
        text = (("," if self._n else "") + "\n" + (ev if isinstance(ev, str) else json.dumps(ev))).encode()
        try:
            os.pwrite(self._fd, text + _TAIL_B, self._pos)
        except OSError as exc:
            log.warn("INIT", "HPCCL_TRACE: writing %s failed (%s); tracing stops", self.path, exc)
            self.close()
            return
        self._pos += len(text)
        self._n += 1

    def call(self, coll: str, seq: int, nbytes: int, kind: str, algo: str, start: float, end: float,
             state: str, steps: Optional[List[list]] = None) -> None:
        """A call as seen by the host: start/end are time.time() seconds. ``steps`` (recorder.py's step
        records: number, sub-communicator, collective, bytes, memory, algorithm, start, end, state) follow
        as child events in the same write, each clamped into the call's interval so viewers nest them."""
        ts, te = round(start * 1e6, 3), round(end * 1e6, 3)
        te = max(ts, te)
        text = (f'{{"name":"{coll}","cat":"{kind}","ph":"X","pid":{self.pid},"tid":0,"ts":{ts:.3f},'
                f'"dur":{te - ts:.3f},"args":{{"seq":{seq},"bytes":{nbytes},'
                f'"algorithm":"{algo}","state":{json.dumps(state)}}}}}')
        if steps:
            parts = [text]
            for k, where, scoll, sbytes, skind, salgo, sstart, send, sstate in steps:
                s0 = min(max(round(sstart * 1e6, 3), ts), te)
                s1 = min(max(round(send * 1e6, 3), s0), te)
                parts.append(f'{{"name":"{where} {scoll}","cat":"step","ph":"X","pid":{self.pid},"tid":0,'
                             f'"ts":{s0:.3f},"dur":{s1 - s0:.3f},"args":{{"seq":{seq},"step":{k},"of":"{coll}",'
                             f'"communicator":"{where}","bytes":{sbytes},"memory":"{skind}","algorithm":"{salgo}",'
                             f'"state":{json.dumps(sstate)}}}}}')
            text = ",\n".join(parts)
        self._emit(text)

    def gpu(self, coll: str, seq: int, nbytes: int, algo: str, start_us: float, dur_us: float) -> None:
        self._emit({"name": coll, "cat": "cuda", "ph": "X", "pid": self.pid, "tid": 1, "ts": round(start_us, 3),
                    "dur": round(dur_us, 3), "args": {"seq": seq, "bytes": nbytes, "algorithm": algo}})

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def _now_us() -> float:
    return time.time() * 1e6


def open_trace(directory: str, tag: str, rank: int, size: int, world_rank: int) -> Optional[TraceFile]:
    """The trace file, or None (with a warning naming the path) when it cannot be written: collectives
    run untraced rather than fail."""
    try:
        return TraceFile(directory, tag, rank, size, world_rank)
    except OSError as exc:
        log.warn("INIT", "HPCCL_TRACE=%s cannot be written (%s); this rank's collectives run untraced",
                 directory, exc)
        return None


class GpuTimer:
    """CUDA events around each traced GPU call on its stream; a call's GPU start is placed on the host
    clock through a reference event recorded (and waited for) when the timer is made."""

    def __init__(self, device: int) -> None:
        from ..kernels import Driver
        self.d = Driver.get()
        self._free: List[int] = []
        self.pending: List[Tuple[int, int, tuple]] = []
        import cupy
        with cupy.cuda.Device(device):
            self.ref = self._event()
            self.d.event_record(ctypes.c_void_p(self.ref), None)
            self.d.event_synchronize(ctypes.c_void_p(self.ref))
            self.ref_us = _now_us()

    def _event(self) -> int:
        return self._free.pop() if self._free else self.d.event(timing=True)

    def begin(self, stream: int) -> Optional[int]:
        if self.d.capturing(stream):
            return None  # a record inside a capture is a graph node, not a timestamp
        ev = self._event()
        self.d.event_record(ctypes.c_void_p(ev), ctypes.c_void_p(stream))
        return ev

    def end(self, start: Optional[int], stream: int, what: tuple) -> None:
        if start is None:
            return
        ev = self._event()
        self.d.event_record(ctypes.c_void_p(ev), ctypes.c_void_p(stream))
        self.pending.append((start, ev, what))

    def harvest(self, out: TraceFile, wait: bool = False) -> None:
        """Write the GPU events of calls whose end event completed (all of them when wait)."""
        keep = []
        for start, ev, what in self.pending:
            if wait:
                self.d.event_synchronize(ctypes.c_void_p(ev))
            elif self.d.event_query(ctypes.c_void_p(ev)) != 0:
                keep.append((start, ev, what))
                continue
            t0 = self.ref_us + self.d.elapsed_ms(self.ref, start) * 1e3
            out.gpu(*what, t0, self.d.elapsed_ms(start, ev) * 1e3)
            self._free += [start, ev]
        self.pending = keep

    def close(self) -> None:
        for e in self._free + [s for s, _, _ in self.pending] + [e for _, e, _ in self.pending] + [self.ref]:
            self.d.event_destroy(ctypes.c_void_p(e))
        self._free, self.pending = [], []


def merge(paths: List[str], align: bool = False) -> dict:
    """One Chrome trace of several ranks' files (each rank its own process row). With align, every file's
    events are shifted so that the files' clock_sync_us (taken at communicator creation, which every rank
    leaves within the bootstrap's exchange) coincide: for nodes whose clocks differ."""
    events: List[dict] = []
    ranks = []
    base: Optional[float] = None
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        meta = d.get("otherData", {})
        ranks.append({"file": os.path.basename(p), **meta})
        shift = 0.0
        if align and "clock_sync_us" in meta:
            base = meta["clock_sync_us"] if base is None else base
            shift = base - meta["clock_sync_us"]
        for ev in d.get("traceEvents", []):
            if shift and "ts" in ev:
                ev = dict(ev, ts=round(ev["ts"] + shift, 3))
            events.append(ev)
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0.0)))
    return {"displayTimeUnit": "ns", "otherData": {"tool": "hpccl-trace merge", "aligned": align, "files": ranks},
            "traceEvents": events}

