"""Scaling model: hpccl's cost model (hpccl.core.tuning.MODELS) run as a simulation for 2..1024 nodes x 8 GPUs,
NVLink inside a node and InfiniBand NDR between nodes (8 NICs x ~48 GB/s per node, one per GPU, as on
rail-optimised H100/H200 systems). Prints markdown tables and writes a plot.

    python bench/scaling_model.py [--png docs/perf/scaling_model.png] [--markdown out.md]

Paths (alpha: per message step, beta: seconds per byte, red: seconds per reduced byte, bar: barrier):
    nvlink  hpccl.core.tuning.DEFAULTS['cuda'] (fitted on 2x H200: ~12 us a step from Python, ~300 GB/s)
    ib      alpha 15 us (hpccl's ~12 us host cost per step + ~3 us NDR/UCX), beta 1/48 GB/s (one NIC),
            red as nvlink (the reduction runs on the GPU)

Strategies compared, per collective and size:
    flat    the multi-node communicator as it is today: the message-passing algorithms (no shared window
            across nodes) of hpccl.core.tuning.MODELS over all M*8 ranks, each step timed on the ib path (a flat ring crosses a node boundary every 8 hops and
            uses one NIC at a time); the tuner picks the cheapest
    hier    hpccl.core.tuning.hier_time (algorithms/hier.py's composition): node-local steps on nvlink + one
            inter-node collective per local rank,
            the 8 of them concurrently, each on its own NIC (rail); sub-algorithms picked the same way
    pick    the cheaper of the two: what hpccl's Tuner chooses on such a communicator
The model has no congestion, no pipelining of tree steps (hpccl's tree model is per whole message) and no
NCCL-style multi-ring; predictions are the model's, not measurements.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpccl.core.tuning import HIER_COLLECTIVES as HIER, best_flat as best, hier_time  # noqa: E402
from hpccl.algorithms import ALGORITHMS  # noqa: E402
from hpccl.core.tuning import DEFAULTS, MODELS, Path as CostPath  # noqa: E402

GPUS = 8
NIC_GBPS = 48.0
NICS = 8
NODES = [2 ** k for k in range(1, 11)]
SIZES = [64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
NVLINK = DEFAULTS["cuda"]
IB = CostPath(alpha=15e-6, beta=1 / (NIC_GBPS * 1e9), red=NVLINK.red, bar=15e-6)
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]
#: across nodes there is no shared window: only message-passing algorithms (what Communicator._algo offers)
NET_ALGOS = {c: [a for a, spec in ALGORITHMS[c].items() if not spec.needs_window and a in MODELS[c]]
             for c in COLLS}
ALL_ALGOS = {c: list(MODELS[c]) for c in COLLS}


def busbw(coll: str, nbytes: float, n: int, seconds: float) -> float:
    """nccl-tests bus bandwidth in GB/s; nbytes is the per-rank buffer (recv for all_gather, send for
    reduce_scatter: the N of tuning.MODELS)."""
    algbw = nbytes / seconds / 1e9
    if coll == "all_reduce":
        return algbw * 2 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter"):
        return algbw * (n - 1) / n
    return algbw


def simulate(coll: str, nbytes: int, nodes: int, gpus: int = GPUS, nics: int = NICS) -> Dict[str, object]:
    """Predicted times and picks for one configuration."""
    n = nodes * gpus
    flat_algo, flat_t = best(coll, IB, nbytes, n, NET_ALGOS[coll])
    out: Dict[str, object] = {"coll": coll, "bytes": nbytes, "nodes": nodes, "ranks": n,
                              "flat_algo": flat_algo, "flat_s": flat_t}
    if coll in HIER:
        # inside a node the GPU path may use its peer-memory window algorithms (oneshot/twoshot/direct)
        hier_t, subs = hier_time(coll, nbytes, nodes, gpus, NVLINK, IB, nics=nics,
                                 inter_algos=sum(NET_ALGOS.values(), []))
        out.update(hier_s=hier_t, hier_algos=subs)
    else:
        out.update(hier_s=float("inf"), hier_algos={})
    pick_hier = out["hier_s"] < flat_t
    out["pick"] = "hier" if pick_hier else flat_algo
    out["pick_s"] = min(out["hier_s"], flat_t)
    for k in ("flat", "hier", "pick"):
        t = out[f"{k}_s"]
        out[f"{k}_busbw"] = busbw(coll, nbytes, n, t) if t != float("inf") else float("nan")
    return out


def _fmt_bytes(n: int) -> str:
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def tables(rows: List[dict]) -> str:
    lines = ["### all_reduce: predicted busbw (GB/s) and the algorithm picked", "",
             "| nodes | ranks | size | flat pick | flat busbw | hier (inter-node algo) | hier busbw | tuner pick | busbw |",
             "|---:|---:|---:|---|---:|---|---:|---|---:|"]
    for r in rows:
        if r["coll"] != "all_reduce" or r["bytes"] not in SIZES:
            continue
        lines.append(f"| {r['nodes']} | {r['ranks']} | {_fmt_bytes(r['bytes'])} | {r['flat_algo']} | "
                     f"{r['flat_busbw']:.1f} | {r['hier_algos'].get('inter_all_reduce', '-')} | "
                     f"{r['hier_busbw']:.1f} | **{r['pick']}** | {r['pick_busbw']:.1f} |")
    lines += ["", "### Every collective at 64 MiB: pick and predicted busbw (GB/s)", "",
              "| nodes | " + " | ".join(COLLS) + " |", "|---:|" + "---|" * len(COLLS)]
    for m in NODES:
        cells = []
        for c in COLLS:
            r = next(x for x in rows if x["coll"] == c and x["nodes"] == m and x["bytes"] == 64 << 20)
            cells.append(f"{r['pick']} {r['pick_busbw']:.1f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: List[dict], png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {64 << 10: "tab:gray", 1 << 20: "tab:blue", 16 << 20: "tab:green", 256 << 20: "tab:orange",
              1 << 30: "tab:red"}
    for size, col in colors.items():
        sel = [r for r in rows if r["coll"] == "all_reduce" and r["bytes"] == size]
        xs = [r["nodes"] for r in sel]
        a1.plot(xs, [r["hier_busbw"] for r in sel], "-o", color=col, label=f"hier {_fmt_bytes(size)}")
        a1.plot(xs, [r["flat_busbw"] for r in sel], "--x", color=col, alpha=0.6, label=f"flat {_fmt_bytes(size)}")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("nodes (x 8 GPUs)")
    a1.set_ylabel("predicted all_reduce busbw (GB/s)")
    a1.set_title("all_reduce: hierarchical vs flat (model)")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=7, ncol=2)
    fine = [simulate("all_reduce", 1 << k, m) for m in NODES for k in range(10, 31)]
    for p in sorted({r["pick"] for r in fine}):
        pts = [(r["nodes"], r["bytes"]) for r in fine if r["pick"] == p]
        a2.scatter([x for x, _ in pts], [y for _, y in pts], s=60, marker="s", label=p)
    a2.set_xscale("log", base=2)
    a2.set_yscale("log", base=2)
    ticks = [1 << k for k in range(10, 31, 4)]
    a2.set_yticks(ticks, [_fmt_bytes(t) for t in ticks])
    a2.set_xlabel("nodes (x 8 GPUs)")
    a2.set_title("all_reduce: algorithm the tuner picks (model)")
    a2.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"hpccl cost model: NVLink inside, IB NDR {NICS}x{NIC_GBPS:.0f} GB/s per node")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--png", default="docs/perf/scaling_model.png")
    p.add_argument("--markdown", default="", help="also write the tables to this file")
    a = p.parse_args()
    sizes = sorted(set(SIZES) | {64 << 20})
    rows = [simulate(c, s, m) for c in COLLS for m in NODES for s in sizes]
    md = tables(rows)
    print(md)
    if a.markdown:
        Path(a.markdown).write_text(md + "\n")
    try:
        plot([r for r in rows if r["bytes"] in SIZES], a.png)
        print(f"\nplot: {a.png}")
    except ImportError:
        print("\n(matplotlib not installed: no plot; pip install matplotlib)")


if __name__ == "__main__":
    main()
