"""hpccl-perf --json runs of two or more trees (or settings) interleaved in one job, side by side: per collective
and size, each tree's hpccl times over its runs (min-max), the median of each tree against the first's, and
whether a tree's range overlaps the first's (within run-to-run spread) or lies wholly above or below it.
Run: python bench/tree_ab.py old='out/ar_tree_old_r*.json' new='out/ar_tree_head_r*.json'"""
from __future__ import annotations

import glob
import json
import statistics
import sys
from typing import Dict, List, Tuple


def load(pattern: str) -> Dict[Tuple[str, int], List[float]]:
    """(collective, bytes) -> hpccl's time in us of every run matching ``pattern`` (results checked wrong=0)."""
    out: Dict[Tuple[str, int], List[float]] = {}
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise SystemExit(f"no file matches {pattern}")
    for p in paths:
        for r in json.load(open(p))["results"]:
            if r.get("wrong", 0):
                raise SystemExit(f"{p}: {r['coll']} {r['size']} B has wrong results")
            out.setdefault((r["coll"], r["size"]), []).append(r["time_us"])
    return out


def main(argv: List[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv):
        print(__doc__)
        return 2
    trees = [(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in argv]
    (base_name, base), rest = trees[0], trees[1:]
    head = f"{'collective':<14}{'bytes':>10}  {base_name + ' us':>18}"
    for name, _ in rest:
        head += f"  {name + ' us':>18} {name + '/' + base_name:>10} {'':>6}"
    print(head)
    for key in sorted(base):
        lo, hi = min(base[key]), max(base[key])
        line = f"{key[0]:<14}{key[1]:>10}  {lo:8.1f}-{hi:8.1f}"
        for _, t in rest:
            v = t.get(key)
            if not v:
                line += f"  {'-':>18} {'-':>10} {'':>6}"
                continue
            ratio = statistics.median(v) / statistics.median(base[key])
            where = "above" if min(v) > hi else "below" if max(v) < lo else "within"
            line += f"  {min(v):8.1f}-{max(v):8.1f} {ratio:10.2f} {where:>6}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
