"""The wire under host collectives between 2 hosts: one message one way, one message each way at once, and
all_gather, hpccl (its network engine) against the MPI library, interleaved in one run, every result checked.
It separates what the link and the 2 cores allow (each way at once is what all_gather of 2 ranks moves) from
what a collective adds on top. Run across network-namespace hosts (tests/net/nethosts.py), one rank each:

    python3 bench/net_pair.py [--sizes 1048576,16777216] [--reps 9] [--json out.json]

Prints per size the median over rounds of the slowest rank's time, hpccl and MPI side by side."""
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
CASES = ("one way", "each way", "all_gather")


def pair_comm(script: str) -> tuple:
    """(MPI, MPI.COMM_WORLD, an hpccl communicator on the network engine over it) for a benchmark of 2 ranks,
    one per host; ``script`` names the benchmark in the error for another rank count."""
    from mpi4py import MPI
    sys.path.insert(0, str(ROOT))
    import hpccl
    world = MPI.COMM_WORLD
    if world.size != 2:
        raise SystemExit(f"{script} runs on 2 ranks")
    os.environ["HPCCL_NET"] = "engine"
    return MPI, world, hpccl.Communicator(world.Dup())


def ranks(args: argparse.Namespace) -> int:
    MPI, world, comm = pair_comm("net_pair.py")
    r, peer = world.rank, 1 - world.rank
    rows = []
    for nbytes in [int(v) for v in args.sizes.split(",")]:
        x = np.full(max(1, nbytes // 4), r + 1, np.float32)
        y, z = np.empty_like(x), np.empty(2 * x.size, np.float32)
        times: dict = {}
        for rep in range(args.reps + 1):  # the first round warms up and is dropped
            for case in CASES:
                for lib in ("hpccl", "mpi"):
                    y.fill(-1)
                    z.fill(-1)
                    world.Barrier()
                    t0 = time.perf_counter()
                    if case == "one way" and lib == "hpccl":
                        comm.send(x, 1) if r == 0 else comm.recv(y, 0)
                    elif case == "one way":
                        world.Send(x, 1) if r == 0 else world.Recv(y, 0)
                    elif case == "each way" and lib == "hpccl":
                        with comm.group():
                            comm.send(x, peer)
                            comm.recv(y, peer)
                    elif case == "each way":
                        world.Sendrecv(x, peer, recvbuf=y, source=peer)
                    elif lib == "hpccl":
                        comm.all_gather(x, z)
                    else:
                        world.Allgather(x, z)
                    dt = time.perf_counter() - t0
                    if case == "all_gather":
                        ok = np.all(z[:x.size] == 1) and np.all(z[x.size:] == 2)
                    else:
                        ok = r == 0 and case == "one way" or np.all(y == peer + 1)
                    if not ok:
                        raise SystemExit(f"{lib} {case} of {nbytes} B is wrong on rank {r}")
                    dt = world.allreduce(dt, op=MPI.MAX)
                    if rep:
                        times.setdefault((case, lib), []).append(dt)
        row = {"bytes": nbytes, **{f"{c}|{lib}": statistics.median(v) for (c, lib), v in times.items()}}
        rows.append(row)
        if r == 0:
            print(f"{nbytes:>10} B" + "".join(
                f"  {c}: hpccl {row[c + '|hpccl'] * 1e3:6.2f} ms MPI {row[c + '|mpi'] * 1e3:6.2f} ms"
                f" ({row[c + '|hpccl'] / row[c + '|mpi']:.2f})" for c in CASES), flush=True)
    if r == 0 and args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    comm.destroy()
    return 0


def launcher(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "net")]
    from nethosts import bench_on_hosts
    return bench_on_hosts(__file__, 2, ["--reps", str(args.reps), "--sizes", args.sizes]
                          + (["--json", args.json] if args.json else []), env={"HPCCL_CHECK_ENV": "0"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sizes", default="1048576,16777216", help="bytes per rank's message, comma-separated")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    return ranks(a) if a.ranks else launcher(a)


if __name__ == "__main__":
    sys.exit(main())
