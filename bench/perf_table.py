"""Turn hpccl-perf --json files into the markdown tables of docs/PERFORMANCE.md: per size, hpccl's time
and busbw, then each baseline's busbw and hpccl's busbw relative to it (above 1: hpccl is faster)."""
from __future__ import annotations

import json
import sys


def human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def table(path: str) -> str:
    data = json.load(open(path))
    rows = data["results"]
    libs = sorted({lib for r in rows for lib in r["baselines"]})
    out = []
    for coll in dict.fromkeys(r["coll"] for r in rows):
        for algo in dict.fromkeys(r["algo"] for r in rows if r["coll"] == coll):
            sel = [r for r in rows if r["coll"] == coll and r["algo"] == algo]
            out.append(f"\n**{coll}**{'' if algo == 'auto' else ' (' + algo + ')'}, {data['ranks']} ranks\n")
            out.append("| size | hpccl us | hpccl busbw GB/s |"
                       + "".join(f" {lib} us | {lib} busbw | hpccl / {lib} |" for lib in libs))
            out.append("|" + "---:|" * (3 + 3 * len(libs)))
            for r in sel:
                line = f"| {human(r['size'])} | {r['time_us']:.1f} | {r['busbw']:.3f} |"
                for lib in libs:
                    b = r["baselines"].get(lib)
                    line += (f" {b['time_us']:.1f} | {b['busbw']:.3f} | **{b['ratio']:.2f}** |" if b
                             else " n/a | n/a | |")
                out.append(line)
    return "\n".join(out)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(table(p))
