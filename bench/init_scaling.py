"""Communicator set-up cost as the job grows: hpccl.init() (bootstrap census and table exchange, transports)
and the bootstrap's allgather of a small per-rank object, timed on every rank; prints the slowest rank's
seconds (median of the repeats). Oversubscribed runs (more ranks than cores) measure the algorithm's
message count more than the network.

    mpiexec -n N python bench/init_scaling.py [--repeats 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

from mpi4py import MPI

import hpccl


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default="")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    inits, gathers = [], []
    for _ in range(a.repeats):
        world.Barrier()
        t0 = time.perf_counter()
        comm = hpccl.init()
        inits.append(time.perf_counter() - t0)
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(10):
            comm._boot.allgather({"rank": comm.rank, "host": "node-%04d" % comm.rank, "pad": "x" * 64})
        gathers.append((time.perf_counter() - t0) / 10)
        comm.destroy()
    mine = sorted(inits)[len(inits) // 2], sorted(gathers)[len(gathers) // 2]
    worst = world.allreduce(mine[0], op=MPI.MAX), world.allreduce(mine[1], op=MPI.MAX)
    if world.rank == 0:
        n = world.size
        print(f"ranks {n:5d}  init {worst[0] * 1e3:9.2f} ms  bootstrap allgather {worst[1] * 1e6:10.1f} us", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(ranks=n, init_s=worst[0], allgather_s=worst[1]), f)


if __name__ == "__main__":
    main()
