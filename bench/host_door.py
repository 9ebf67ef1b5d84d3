"""Host time per small host call through the communicator's C front doors (hpccl/csrc/_frontdoor.c) against
the same communicator's Python methods (what HPCCL_HOST_DOOR=0 calls), with MPI's call beside them: one
communicator, rounds interleaved, every result checked. Runs on whatever layout it is launched in (one node:
the shared-memory hot path; HPCCL_NODE_ID=split:1: the compiled path across nodes over the engine):

    mpiexec -n 2 python3 bench/host_door.py [--reps 41] [--iters 2000] [--sizes 8,1024] [--json out.json]
    python3 bench/host_door.py --hosts 2 [...]   # one rank per network-namespace host (tests/net/nethosts.py),
                                                 # each bound to a core, UCX and MPI over TCP

Each round times --iters calls back to back after a barrier and keeps the slowest rank's time per call;
printed: per collective and size, the median over rounds of each way, and door / method and door / MPI."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

COLLS = ("all_reduce", "broadcast", "all_gather")


def interleaved(ways: dict, coll: str, x: np.ndarray, y: np.ndarray, world, reps: int, iters: int) -> dict:
    """Per way (name -> callable taking the collective's arguments: (x, y), or (y, root) for broadcast), the
    slowest rank's seconds per call of each round after the first (a warm-up): rounds interleave the ways in
    alternating order, each times ``iters`` calls back to back after a barrier, and every result is checked."""
    from mpi4py import MPI
    n, r = world.size, world.rank
    count = x.size
    want = (np.full_like(y, n * (n + 1) / 2) if coll == "all_reduce" else np.ones_like(y)
            if coll == "broadcast" else np.repeat(np.arange(1, n + 1, dtype=np.float32), count))
    times: dict = {w: [] for w in ways}
    for rep in range(reps + 1):
        for w in (list(ways) if rep % 2 else list(reversed(ways))):
            f = ways[w]
            y.fill(1 if coll == "broadcast" and r == 0 else -1)
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                if coll == "broadcast":
                    f(y, 0)
                else:
                    f(x, y)
            dt = (time.perf_counter() - t0) / iters
            if not np.array_equal(y, want):
                raise SystemExit(f"{w} {coll} of {x.nbytes} B is wrong on rank {r}")
            if rep:
                times[w].append(world.allreduce(dt, op=MPI.MAX))
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--sizes", default="8,1024")
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--json", default="")
    ap.add_argument("--hosts", type=int, default=0, help="run as one rank per network-namespace host")
    ap.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hosts:
        sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "net")]
        from nethosts import bench_on_hosts
        return bench_on_hosts(__file__, args.hosts, ["--reps", str(args.reps), "--iters", str(args.iters), "--sizes",
                                                     args.sizes, "--colls", args.colls]
                              + (["--json", str(Path(args.json).resolve())] if args.json else []),
                              env={"HPCCL_CHECK_ENV": "0"}, timeout=1200, launch=["--bind-to", "core"])
    from mpi4py import MPI
    import hpccl
    world = MPI.COMM_WORLD
    comm = hpccl.Communicator(world.Dup())
    n, r = comm.size, comm.rank
    doors = {c: comm.__dict__.get(c) for c in COLLS}
    if any(type(d).__name__ != "FrontDoor" for d in doors.values()):
        raise SystemExit(f"no C front doors on this communicator (hot path {type(comm._hot).__name__}, "
                         f"HPCCL_HOST_DOOR): {doors}")
    rows = []
    for coll in args.colls.split(","):
        method = getattr(type(comm), coll).__get__(comm)
        for nbytes in [int(v) for v in args.sizes.split(",")]:
            count = max(1, nbytes // 4)
            x = np.full(count, r + 1, np.float32)
            y = np.empty(count * n if coll == "all_gather" else count, np.float32)
            mpi = {"all_reduce": lambda x, y: world.Allreduce(x, y), "all_gather": lambda x, y: world.Allgather(x, y),
                   "broadcast": lambda y, root: world.Bcast(y, root=root)}[coll]
            times = interleaved({"door": doors[coll], "method": method, "mpi": mpi}, coll, x, y, world, args.reps,
                                args.iters)
            med = {w: statistics.median(v) for w, v in times.items()}
            rows.append({"coll": coll, "bytes": nbytes, **{f"{w}_s": v for w, v in med.items()}})
            if r == 0:
                print(f"{coll:>11} {nbytes:>7} B  door {med['door'] * 1e6:6.2f} us  method {med['method'] * 1e6:6.2f}"
                      f" us  MPI {med['mpi'] * 1e6:6.2f} us  door/method {med['door'] / med['method']:.2f}"
                      f"  door/MPI {med['door'] / med['mpi']:.2f}", flush=True)
    if r == 0 and args.json:
        Path(args.json).write_text(json.dumps({"ranks": n, "nodes": comm.num_nodes, "hot": type(comm._hot).__name__,
                                               "reps": args.reps, "iters": args.iters, "rows": rows}, indent=1))
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
