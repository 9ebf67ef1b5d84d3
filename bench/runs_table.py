"""Several hpccl-perf --json runs of the same sweep, side by side: per collective and size, the ratio
baseline time / hpccl time (above 1: hpccl is faster) of every run, their median and spread, and the sizes
where any run is below 1. With --floor FILE (bench/copy_floor.py --json), hpccl's broadcast and all_gather
times against the single-copy floor too (and, from copy_floor.py --procs N, against N processes copying at once).
Run: python bench/runs_table.py [--baseline mpi] [--floor floor.json] run1.json run2.json run3.json"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Dict, List, Tuple


def load(paths: List[str], base: str) -> Tuple[Dict[Tuple[str, int], List[Tuple[float, float]]], int]:
    """(collective, size) -> [(hpccl us, baseline us)] in run order, and the rank count."""
    out: Dict[Tuple[str, int], List[Tuple[float, float]]] = {}
    ranks = 0
    for p in paths:
        d = json.load(open(p))
        ranks = d["ranks"]
        for r in d["results"]:
            if r.get("algo", "auto") != "auto" or base not in r["baselines"]:
                continue
            out.setdefault((r["coll"], r["size"]), []).append((r["time_us"], r["baselines"][base]["time_us"]))
    return out, ranks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--baseline", default="mpi")
    ap.add_argument("--floor", default="", help="copy_floor.py --json output: {size: us}")
    a = ap.parse_args()
    rows, ranks = load(a.runs, a.baseline)
    raw = json.load(open(a.floor)) if a.floor else {}
    both = "1" in raw  # copy_floor.py --procs N: one process's floor and N processes' at once
    floor = {int(k): v for k, v in (raw["1"] if both else raw).items()}
    k_many = next((k for k in raw if k != "1"), "") if both else ""
    many = {int(k): v for k, v in raw[k_many].items()} if both else {}
    print(f"{len(a.runs)} runs, {ranks} ranks; ratio = {a.baseline} time / hpccl time (above 1: hpccl faster)")
    head = "| collective | size | " + " | ".join(f"run {i + 1}" for i in range(len(a.runs))) + " | median | spread |"
    if floor:
        head += " hpccl us (median) | floor us | hpccl / floor |" + (f" floor, {k_many} at once | hpccl / it |" if many else "")
    print(head)
    print("|---|---:|" + "---:|" * (len(a.runs) + 2) + ("---:|---:|---:|" if floor else "") + ("---:|---:|" if many else ""))
    slower = []
    for (coll, size), vals in rows.items():
        ratios = [b / h for h, b in vals]
        med = statistics.median(ratios)
        line = (f"| {coll} | {size} | " + " | ".join(f"{x:.2f}" for x in ratios)
                + f" | {med:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
        if floor and coll in ("broadcast", "all_gather") and size in floor:
            h = statistics.median(h for h, _ in vals)
            line += f" {h:.1f} | {floor[size]:.1f} | {h / floor[size]:.2f} |"
            if many:
                line += f" {many[size]:.1f} | {h / many[size]:.2f} |"
        elif floor:
            line += " | | |" + (" | |" if many else "")
        print(line)
        if min(ratios) < 1.0:
            slower.append(f"{coll} {size} B ({', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"\nbelow 1.0 in some run: {len(slower)} of {len(rows)} points")
    for s in slower:
        print("  " + s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
