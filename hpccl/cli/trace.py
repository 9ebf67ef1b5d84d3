"""hpccl-trace: join the per-rank HPCCL_TRACE files into one Chrome trace / Perfetto timeline.

    hpccl-trace merge TRACE_DIR_OR_FILES... -o merged.json [--align]
    hpccl-trace summary FILE_OR_DIR...

Open the merged file in https://ui.perfetto.dev or chrome://tracing: one process row per rank, a host
track and (for GPU calls) a GPU track per communicator."""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict
from typing import List, Optional

from ..text import block
from ..observe.trace import merge


def _say(text: str, **kw: object) -> None:
    """print() of plain text: trace files carry host names and labels from other software."""
    print(block(text), **kw)  # type: ignore[arg-type]


def _files(items: List[str]) -> List[str]:
    out: List[str] = []
    for it in items:
        if os.path.isdir(it):
            out += sorted(glob.glob(os.path.join(it, "hpccl-trace-*.json")))
        else:
            out.append(it)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="hpccl-trace", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="one timeline of every rank's trace file")
    m.add_argument("paths", nargs="+", help="HPCCL_TRACE folders or trace files")
    m.add_argument("-o", "--output", required=True)
    m.add_argument("--align", action="store_true",
                   help="shift each file so the communicators' creation times coincide (nodes whose clocks differ)")
    s = sub.add_parser("summary", help="calls and time per collective and algorithm, per rank")
    s.add_argument("paths", nargs="+")
    a = p.parse_args(argv)
    files = _files(a.paths)
    if not files:
        _say(f"hpccl-trace: no hpccl-trace-*.json in {' '.join(a.paths)}", file=sys.stderr)
        return 2
    if a.cmd == "merge":
        out = merge(files, a.align)
        with open(a.output, "w") as f:
            json.dump(out, f)
        events = [e for e in out["traceEvents"] if e.get("ph") == "X"]
        steps = sum(1 for e in events if e.get("cat") == "step")
        _say(f"{a.output}: {len(files)} files, {len(events) - steps} call events and {steps} step events; open "
              "it in https://ui.perfetto.dev")
        return 0
    for path in files:
        with open(path) as f:
            d = json.load(f)
        meta = d.get("otherData", {})
        rows = defaultdict(lambda: [0, 0.0])
        for e in d.get("traceEvents", []):
            if e.get("ph") == "X":
                args = e.get("args", {})
                step = e.get("cat") == "step"  # a hier call's step: its time is inside its call's
                name = f"  {e['name']} (step of {args.get('of', '?')})" if step else e["name"]
                key = (args.get("of", e["name"]) if step else e["name"], step, name, args.get("algorithm", ""),
                       "gpu" if e.get("tid") == 1 else "host")
                r = rows[key]
                r[0] += 1
                r[1] += e.get("dur", 0.0)
        _say(f"{os.path.basename(path)} (rank {meta.get('rank')} of {meta.get('size')}, {meta.get('host')})")
        for (_, step, name, algo, track), (n, us) in sorted(rows.items()):
            _say(f"  {name:<16} {algo or '-':<10} {track:<5} {n:>8} {'steps' if step else 'calls'} "
                  f"{us / 1e3:>12.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
