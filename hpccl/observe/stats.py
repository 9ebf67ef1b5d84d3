"""Per-communicator counters: calls, bytes and seconds per collective and algorithm (comm.stats()).
Seconds are host time inside the call: for GPU calls that is the time to enqueue, not the GPU's time
(HPCCL_TRACE has that). A composite call (hier) is counted once, in its own row; the steps it ran on the
sub-communicators are counted under that row ("steps"), not as calls of their own."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List


class Stats:
    """[calls, bytes, seconds] per (collective, memory kind, algorithm), plus rows counted elsewhere (the
    compiled hot path counts its own calls in C: ``external`` callables return (collective, kind,
    algorithm, calls, bytes, seconds) rows). ``steps``: per row of a composite call, [calls, bytes, seconds]
    per (step, algorithm), e.g. ("inter all_reduce", "ring")."""

    __slots__ = ("table", "external", "steps")

    def __init__(self) -> None:
        self.table: Dict[tuple, List[float]] = {}
        self.external: List[Callable[[], Iterable[tuple]]] = []
        self.steps: Dict[tuple, Dict[tuple, List[float]]] = {}

    def add(self, coll: str, kind: str, algo: str, nbytes: int, seconds: float) -> None:
        row = self.table.get((coll, kind, algo))
        if row is None:
            row = self.table[(coll, kind, algo)] = [0, 0, 0.0]
        row[0] += 1
        row[1] += nbytes
        row[2] += seconds

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
