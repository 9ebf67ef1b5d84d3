#!/usr/bin/env python3
"""Plot bench/gpu_bench.py's JSON: all_reduce latency (left) and busbw of every collective (right),
hpccl against NCCL.   python bench/plot_gpu.py docs/perf/bench.json docs/perf/gpu_vs_nccl.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = [r for r in json.load(open(src))["rows"] if r.get("coll") != "launch" and "sweep" not in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    ar = sorted((r for r in rows if r["coll"] == "all_reduce" and r["dtype"] == "float32"), key=lambda r: r["size"])
    x = [r["size"] for r in ar]
    ax1.plot(x, [r["hpccl_us"] for r in ar], "o-", label="hpccl (launched from Python)")
    ax1.plot(x, [r["hpccl_graph_us"] for r in ar], "o--", label="hpccl (CUDA graph replay)")
    ax1.plot(x, [r["nccl_us"] for r in ar], "s-", label="NCCL 2.28 (via CuPy)")
    ax1.plot(x, [r.get("nccl_graph_us") for r in ar], "s--", label="NCCL (CUDA graph replay)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("bytes")
    ax1.set_ylabel("time per op (us)")
    ax1.set_title("all_reduce float32, 2x H200 NV18")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    colors = {"all_reduce": "C0", "all_gather": "C1", "reduce_scatter": "C2", "broadcast": "C3"}
    for coll, c in colors.items():
        rs = sorted((r for r in rows if r["coll"] == coll and r["dtype"] == "float32"), key=lambda r: r["size"])
        xs = [r["size"] for r in rs]
        ax2.plot(xs, [r["hpccl_busbw"] for r in rs], "o-", color=c, label=f"hpccl {coll}")
        ax2.plot(xs, [r["nccl_busbw"] for r in rs], "s:", color=c, label=f"NCCL {coll}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("bytes")
    ax2.set_ylabel("busbw (GB/s)")
    ax2.set_title("bus bandwidth (nccl-tests definition)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
