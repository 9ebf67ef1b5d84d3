"""gather, scatter, all_gather_v and reduce_scatter_v three ways in one run, rounds interleaved, every result
checked: as planned (comm.gather ...), as one group of sends and receives (the same call inside comm.group(),
the direct schedule every call ran before planning), and MPI's (mpi4py: Gather, Scatter, Allgatherv,
Reduce_scatter). Uneven counts for the v-collectives: rank r's block is (r+1) x the size's base count.

    mpiexec -n 2 python3 bench/vcolls_ab.py [--reps 11] [--iters 300] [--sizes 8,256,8192,262144]
    HPCCL_NODE_ID=split:1 mpiexec -n 2 python3 bench/vcolls_ab.py      # every rank its own emulated node

Each round times --iters calls after a barrier and keeps the slowest rank's time per call; printed per
collective and size (bytes of one even block): the median over rounds of each way in us, and the ratios
planned / group and MPI / planned (above 1: hpccl faster)."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpccl

COLLS = ("gather", "scatter", "all_gather_v", "reduce_scatter_v")


def setup(comm, mpi, coll: str, nbytes: int):
    """(hpccl call, MPI call, check) for one collective and size on float32 buffers."""
    n, r = comm.size, comm.rank
    base = max(1, nbytes // 4)
    if coll in ("gather", "scatter"):
        counts = [base] * n
    else:
        counts = [(j + 1) * base for j in range(n)]
    total, disp = sum(counts), [sum(counts[:j]) for j in range(n)]
    f = np.float32
    if coll == "gather":
        s, out = np.full(base, r, f), np.zeros(n * base, f)
        exp = np.repeat(np.arange(n, dtype=f), base)
        return (lambda: comm.gather(s, out, 0), lambda: mpi.Gather(s, out, 0),
                lambda: r != 0 or np.array_equal(out, exp))
    if coll == "scatter":
        s, out = np.repeat(np.arange(n, dtype=f), base), np.zeros(base, f)
        return (lambda: comm.scatter(s if r == 0 else None, out, 0), lambda: mpi.Scatter(s, out, 0),
                lambda: bool((out == r).all()))
    if coll == "all_gather_v":
        s, out = np.full(counts[r], r, f), np.zeros(total, f)
        exp = np.repeat(np.arange(n, dtype=f), counts)
        return (lambda: comm.all_gather_v(s, out, counts), lambda: mpi.Allgatherv(s, [out, counts, disp, MPI.FLOAT]),
                lambda: np.array_equal(out, exp))
    s, out = np.ones(total, f), np.zeros(counts[r], f)
    return (lambda: comm.reduce_scatter_v(s, out, counts), lambda: mpi.Reduce_scatter(s, out, counts, MPI.SUM),
            lambda: bool((out == n).all()))


def timed(mpi, fn, iters: int) -> float:
    mpi.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t) / iters
    return mpi.allreduce(dt, op=MPI.MAX)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--sizes", default="8,256,8192,262144")
    ap.add_argument("--colls", default=",".join(COLLS))
    a = ap.parse_args()
    mpi = MPI.COMM_WORLD
    comm = hpccl.init()
    if comm.rank == 0:
        print(f"# {comm.size} ranks, {comm.num_nodes} node(s); float32; median of {a.reps} rounds x {a.iters} calls")
        print(f"# {'collective':17s} {'bytes':>8s} {'planned us':>11s} {'group us':>9s} {'mpi us':>8s} "
              f"{'group/planned':>14s} {'mpi/planned':>12s}")
    for coll in a.colls.split(","):
        for nb in (int(x) for x in a.sizes.split(",")):
            call, ref, ok = setup(comm, mpi, coll, nb)

            def grouped():
                with comm.group():
                    call()
            ways = {"planned": call, "group": grouped, "mpi": ref}
            if coll == "reduce_scatter_v":
                ways["group"] = None  # it cannot be held in a group: its direct schedule is forced instead
            got = {k: [] for k in ways}
            for _ in range(a.reps):
                for k, fn in ways.items():
                    if fn is None:
                        comm._planner.force(coll, "direct")
                        got[k].append(timed(mpi, call, a.iters))
                        comm._planner.force(coll, None)
                    else:
                        got[k].append(timed(mpi, fn, a.iters))
                    if not mpi.allreduce(bool(ok()), op=MPI.LAND):
                        raise SystemExit(f"{coll} {nb} B {k}: wrong result")
            med = {k: statistics.median(v) * 1e6 for k, v in got.items()}
            if comm.rank == 0:
                print(f"  {coll:17s} {nb:8d} {med['planned']:11.1f} {med['group']:9.1f} {med['mpi']:8.1f} "
                      f"{med['group'] / med['planned']:14.2f} {med['mpi'] / med['planned']:12.2f}", flush=True)
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
