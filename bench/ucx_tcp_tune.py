"""hpccl's UCX TCP settings (HPCCL_UCX_TCP_TUNE) measured: host all_reduce between separate hosts, with
UCX's default TCP settings and with hpccl's, against the MPI library's own Allreduce, in one run, rounds
interleaved, every result checked. Run it across network-namespace hosts (tests/net/nethosts.py):

    python3 bench/ucx_tcp_tune.py --hosts 2      # makes the hosts, runs 1 rank on each, removes them

Inside (under mpiexec on those hosts) it is started with --ranks. Prints one row per size: median time of
each library and the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = (8, 64 << 10, 1 << 20, 16 << 20, 64 << 20)


def ranks(args: argparse.Namespace) -> int:
    from mpi4py import MPI
    import hpccl
    world = MPI.COMM_WORLD
    comms = {}
    for name, tune in (("default", "0"), ("tuned", "1")):
        os.environ["HPCCL_UCX_TCP_TUNE"] = tune  # read when the communicator's UCX context is made
        comms[name] = hpccl.Communicator(world.Dup())
    assert comms["tuned"]._transports and comms["default"].num_nodes == world.size
    rows = []
    for nbytes in SIZES:
        n = max(1, nbytes // 4)
        x = np.full(n, world.rank + 1, np.float32)
        want = np.float32(world.size * (world.size + 1) / 2)
        times = {"default": [], "tuned": [], "mpi": []}
        reps = args.reps if nbytes < (16 << 20) else max(3, args.reps // 3)
        for _ in range(reps + 1):  # the first round warms up and is dropped
            for name in ("default", "tuned", "mpi"):
                y = np.empty_like(x)
                world.Barrier()
                t0 = time.perf_counter()
                if name == "mpi":
                    world.Allreduce(x, y)
                else:
                    comms[name].all_reduce(x, y)
                dt = time.perf_counter() - t0
                if not np.all(y == want):
                    raise SystemExit(f"{name} all_reduce of {nbytes} B is wrong on rank {world.rank}")
                times[name].append(world.allreduce(dt, op=MPI.MAX))
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        rows.append({"bytes": nbytes, **{f"{k}_s": v for k, v in med.items()}})
    if world.rank == 0:
        print(f"{'bytes':>10} {'UCX default':>12} {'hpccl TCP':>12} {'MPI':>12} {'tuned/default':>14} "
              f"{'default/MPI':>12} {'tuned/MPI':>10}")
        for r in rows:
            print(f"{r['bytes']:>10} {r['default_s'] * 1e6:>10.0f}us {r['tuned_s'] * 1e6:>10.0f}us "
                  f"{r['mpi_s'] * 1e6:>10.0f}us {r['tuned_s'] / r['default_s']:>14.2f} "
                  f"{r['default_s'] / r['mpi_s']:>12.2f} {r['tuned_s'] / r['mpi_s']:>10.2f}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"ranks": world.size, "rows": rows}, indent=1))
    for c in comms.values():
        c.destroy()
    return 0


def launcher(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "net")]
    from nethosts import bench_on_hosts
    return bench_on_hosts(__file__, args.hosts, ["--reps", str(args.reps)]
                          + (["--json", args.json] if args.json else []), timeout=900)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    return ranks(a) if a.ranks else launcher(a)


if __name__ == "__main__":
    sys.exit(main())
