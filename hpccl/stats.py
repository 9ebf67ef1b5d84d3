"""Per-communicator counters: calls, bytes and seconds per collective and algorithm (comm.stats()).
Seconds are host time inside the call: for GPU calls that is the time to enqueue, not the GPU's time
(HPCCL_TRACE has that)."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List


class Stats:
    """[calls, bytes, seconds] per (collective, memory kind, algorithm), plus rows counted elsewhere (the
    compiled hot path counts its own calls in C: ``external`` callables return (collective, kind,
    algorithm, calls, bytes, seconds) rows)."""

    __slots__ = ("table", "external")

    def __init__(self) -> None:
        self.table: Dict[tuple, List[float]] = {}
        self.external: List[Callable[[], Iterable[tuple]]] = []

    def add(self, coll: str, kind: str, algo: str, nbytes: int, seconds: float) -> None:
        row = self.table.get((coll, kind, algo))
        if row is None:
            row = self.table[(coll, kind, algo)] = [0, 0, 0.0]
        row[0] += 1
        row[1] += nbytes
        row[2] += seconds

    def snapshot(self) -> Dict[str, Dict[str, dict]]:
        """{collective: {"algorithm (memory)": {"calls", "bytes", "seconds"}}}, sorted by name."""
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
            out.setdefault(coll, {})[f"{algo or '-'} ({kind})"] = {"calls": int(calls), "bytes": int(nbytes),
                                                                  "seconds": secs}
        return out

    def lines(self) -> List[str]:
        """A table for people (hpccl-perf --verbose)."""
        out = [f"{'collective':<16}{'algorithm (memory)':<24}{'calls':>10}{'bytes':>16}{'seconds':>12}{'us/call':>11}"]
        for coll, algos in self.snapshot().items():
            for name, r in algos.items():
                out.append(f"{coll:<16}{name:<24}{r['calls']:>10}{r['bytes']:>16}{r['seconds']:>12.4f}"
                           f"{r['seconds'] / max(1, r['calls']) * 1e6:>11.2f}")
        return out
