"""Check the cost model's picks against measurement: for each size, the fastest algorithm measured
(hpccl-perf --algo ...) next to the one the Tuner picks, and how much slower the pick is than the best.

    python bench/crossovers.py docs/perf/host/algos-ag-rs-2ranks.json --path shm --ranks 4 --local 4
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

from hpccl.core.tuning import Tuner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--path", default="shm")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--local", type=int, required=True)
    a = ap.parse_args()
    rows = json.load(open(a.json))["results"]
    by = defaultdict(dict)
    for r in rows:
        by[(r["coll"], r["size"])][r["algo"]] = r["time_us"]
    tuner = Tuner(a.path, a.ranks, a.local)
    print("| collective | size | fastest measured | model picks | pick / best time |")
    print("|---|---|---|---|---|")
    worst = 1.0
    for (coll, size), times in sorted(by.items()):
        if size == 0:
            continue
        best = min(times, key=times.get)
        pick = tuner.choose(coll, size, list(times))
        ratio = times[pick] / times[best]
        worst = max(worst, ratio)
        print(f"| {coll} | {size} | {best} ({times[best]:.1f} us) | {pick} | {ratio:.2f} |")
    print(f"\nworst pick / best: {worst:.2f}")


if __name__ == "__main__":
    main()
