"""Per-communicator counters: calls, bytes and seconds per collective and algorithm (comm.stats()).
Seconds are host time inside the call: for GPU calls that is the time to enqueue, not the GPU's time
(HPCCL_TRACE has that). A composite call (hier) is counted once, in its own row; the steps it ran on the
sub-communicators are counted under that row ("steps"), not as calls of their own."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Set

#: latency buckets (HPCCL_METRICS): bucket 0 holds calls under 2**LAT_LOW ns, bucket i those under
#: 2**(LAT_LOW + i) ns, the last every longer one; the compiled paths count the same (hpccl/csrc/_lathist.h)
LAT_BUCKETS, LAT_LOW = 30, 8


def lat_bucket(seconds: float) -> int:
    """The latency bucket of a call that took ``seconds``."""
    b = int(seconds * 1e9).bit_length() - LAT_LOW if seconds > 0 else 0
    return 0 if b < 0 else (b if b < LAT_BUCKETS else LAT_BUCKETS - 1)


class Stats:
    """[calls, bytes, seconds] per (collective, memory kind, algorithm), plus rows counted elsewhere (the
    compiled hot path counts its own calls in C: ``external`` callables return (collective, kind,
    algorithm, calls, bytes, seconds) rows). ``steps``: per row of a composite call, [calls, bytes, seconds]
    per (step, algorithm), e.g. ("inter all_reduce", "ring").

    For metrics (hpccl/observe/metrics.py) the rows keep their path apart: ``table`` is the validated
    (Python) path's, ``replayed`` the GPU calls enqueued from a snapshot or recording, and ``detail``
    callables give the compiled paths' rows split by path with their latency buckets. ``latency``: each
    call's time is counted in log2 buckets too (``hists``), only while metrics are on. ``errors``: the
    errors this communicator's calls raised, by class name; ``lost``: the peers they found failed;
    ``busy``: callables, true while a compiled path's call is pending."""

    __slots__ = ("table", "external", "steps", "replayed", "detail", "latency", "hists", "errors", "lost",
                 "busy")

    def __init__(self, latency: bool = False) -> None:
        self.table: Dict[tuple, List[float]] = {}
        self.external: List[Callable[[], Iterable[tuple]]] = []
        self.steps: Dict[tuple, Dict[tuple, List[float]]] = {}
        self.replayed: Dict[tuple, List[float]] = {}
        self.detail: List[Callable[[], Iterable[tuple]]] = []
        self.latency = latency
        self.hists: Dict[tuple, List[int]] = {}
        self.errors: Dict[str, int] = {}
        self.lost: Set[int] = set()
        self.busy: List[Callable[[], bool]] = []

    def add(self, coll: str, kind: str, algo: str, nbytes: int, seconds: float) -> None:
        row = self.table.get((coll, kind, algo))
        if row is None:
            row = self.table[(coll, kind, algo)] = [0, 0, 0.0]
        row[0] += 1
        row[1] += nbytes
        row[2] += seconds
        if self.latency:
            self._observe((coll, kind, algo, "python"), seconds)

    def add_replayed(self, coll: str, kind: str, algo: str, nbytes: int, seconds: float) -> None:
        """A GPU call enqueued from its launch snapshot or recording (no validation)."""
        row = self.replayed.get((coll, kind, algo))
        if row is None:
            row = self.replayed[(coll, kind, algo)] = [0, 0, 0.0]
        row[0] += 1
        row[1] += nbytes
        row[2] += seconds
        if self.latency:
            self._observe((coll, kind, algo, "replayed"), seconds)

    def _observe(self, key: tuple, seconds: float) -> None:
        h = self.hists.get(key)
        if h is None:
            h = self.hists[key] = [0] * LAT_BUCKETS
        h[lat_bucket(seconds)] += 1

    def error(self, exc: BaseException, lost: Optional[int] = None) -> None:
        """Count an error a call raised (by its class), and the peer it found failed, if any."""
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        if lost is not None:
            self.lost.add(lost)

    def attach(self, rows: Callable[[], Iterable[tuple]], detail: Callable[[], Iterable[tuple]],
               busy: Optional[Callable[[], bool]] = None) -> None:
        """Rows a compiled path counts itself: ``rows`` for snapshot(), (collective, kind, algorithm, calls,
        bytes, seconds); ``detail`` for metrics, (path, collective, kind, algorithm, calls, bytes, seconds,
        latency buckets or None); ``busy``: true while one of its calls is pending."""
        self.external.append(rows)
        self.detail.append(detail)
        if busy is not None:
            self.busy.append(busy)

    def rows(self) -> List[tuple]:
        """Every row by path, for metrics: (path, collective, kind, algorithm, calls, bytes, seconds,
        latency buckets or None). Safe to call from another thread (copies are taken whole)."""
        hists: Dict[tuple, Any] = dict(list(self.hists.items()))
        out = [("python", c, k, a, int(r[0]), int(r[1]), r[2], hists.get((c, k, a, "python")))
               for (c, k, a), r in list(self.table.items())]
        out += [("replayed", c, k, a, int(r[0]), int(r[1]), r[2], hists.get((c, k, a, "replayed")))
                for (c, k, a), r in list(self.replayed.items())]
        for fn in list(self.detail):
            out.extend(fn())
        return [r for r in out if r[4]]

    def add_step(self, coll: str, kind: str, algo: str, step: str, step_algo: str, nbytes: int,
                 seconds: float) -> None:
        """A step (e.g. "intra reduce_scatter") of a call counted in row (coll, kind, algo)."""
        steps = self.steps.get((coll, kind, algo))
        if steps is None:
            steps = self.steps[(coll, kind, algo)] = {}
        row = steps.get((step, step_algo))
        if row is None:
            row = steps[(step, step_algo)] = [0, 0, 0.0]
        row[0] += 1
        row[1] += nbytes
        row[2] += seconds

    def snapshot(self) -> Dict[str, Dict[str, dict]]:
        """{collective: {"algorithm (memory)": {"calls", "bytes", "seconds"}}}, sorted by name; a composite
        call's row also has "steps": {"step (algorithm)": {"calls", "bytes", "seconds"}}."""
        out: Dict[str, Dict[str, dict]] = {}
        rows = {k: list(v) for k, v in self.table.items()}
        for k, v in self.replayed.items():
            r = rows.setdefault(k, [0, 0, 0.0])
            for i in range(3):
                r[i] += v[i]
        for ext in self.external:
            for coll, kind, algo, calls, nbytes, secs in ext():
                r = rows.setdefault((coll, kind, algo), [0, 0, 0.0])
                r[0] += calls
                r[1] += nbytes
                r[2] += secs
        for (coll, kind, algo), (calls, nbytes, secs) in sorted(rows.items()):
            if not calls:
                continue
            row = out.setdefault(coll, {})[f"{algo or '-'} ({kind})"] = {"calls": int(calls), "bytes": int(nbytes),
                                                                        "seconds": secs}
            steps = self.steps.get((coll, kind, algo))
            if steps:
                row["steps"] = {f"{step} ({a or '-'})": {"calls": int(n), "bytes": int(b), "seconds": t}
                                for (step, a), (n, b, t) in sorted(steps.items())}
        return out

    def lines(self) -> List[str]:
        """A table for people (hpccl-perf --verbose); a composite call's steps are indented under its row."""
        out = [f"{'collective':<16}{'algorithm (memory)':<30}{'calls':>10}{'bytes':>16}{'seconds':>12}{'us/call':>11}"]

        def line(coll: str, name: str, r: dict) -> str:
            return (f"{coll:<16}{name:<30}{r['calls']:>10}{r['bytes']:>16}{r['seconds']:>12.4f}"
                    f"{r['seconds'] / max(1, r['calls']) * 1e6:>11.2f}")
        for coll, algos in self.snapshot().items():
            for name, r in algos.items():
                out.append(line(coll, name, r))
                for step, sr in r.get("steps", {}).items():
                    out.append(line("", "  " + step, sr))
        return out
