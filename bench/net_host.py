"""Host buffers between separate hosts: hpccl through its native network engine (with and without its
compiled path for small calls) and the MPI library, side by side in one run (rounds
interleaved, every result checked; each library's output buffer is made once per size and refilled before
every call, as a reused buffer's pages are resident). Run it across network-namespace hosts (tests/net/nethosts.py), one rank per host, UCX and MPI over TCP:

    python3 bench/net_host.py --hosts 2 [--reps 9] [--iters 20] [--paths engine,engine-method,engine-py] [--bind core]
                              [--json out.json]

Inside (under mpiexec on those hosts) it is started with --ranks. Each round times --iters calls back to
back below 1 MiB (one call from 1 MiB), after a barrier, and takes the slowest rank's time per call. Prints,
per collective and size, the median over rounds of each and the ratios to MPI. --paths picks hpccl's paths
(default: the engine as a user gets it); each is a communicator with its own engine thread, so on a small
host a second one competes with the first and with MPI for the cores, except engine-method: the engine's
communicator called through its Python methods instead of its C front doors. --bind core has mpiexec bind each rank
(every thread of it: the caller and hpccl's engine thread alike, and MPI's) to a core of its own, as an HPC
launcher does (mpiexec/srun --bind-to core, --cpu-bind=cores); the hosts share this machine's cores, so
unbound, two ranks' four threads are placed anew in every run (docs/PERFORMANCE.md)."""
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
SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
COLLS = ("all_reduce", "broadcast", "all_gather")
#: hpccl's network paths: the engine with its compiled path for small calls (hpccl/csrc/_nethot.c, the default,
#: entered through the communicator's C front doors, hpccl/csrc/_frontdoor.c), the same communicator called
#: through its Python methods (HPCCL_HOST_DOOR=0's way, with "engine": no second engine), and the engine with
#: Python's schedules only (HPCCL_NET_HOT_SIZE=0); the ucxx transport of earlier runs
#: (docs/perf/host/engine-vs-mpich-2hosts.txt) was removed in issue 34
PATHS = ("engine", "engine-method", "engine-py")


def _call(comms: dict, world, name: str, coll: str, x: np.ndarray, y: np.ndarray) -> None:
    if name == "mpi":
        if coll == "all_reduce":
            world.Allreduce(x, y)
        elif coll == "broadcast":
            world.Bcast(y, root=0)
        else:
            world.Allgather(x, y)
    else:
        if name == "engine-method":  # the engine's communicator, through the Python methods (not its C doors)
            f = getattr(type(comms["engine"]), coll).__get__(comms["engine"])
        else:
            f = getattr(comms[name], coll)
        if coll == "all_reduce":
            f(x, y)
        elif coll == "broadcast":
            f(y, root=0)
        else:
            f(x, y)


def ranks(args: argparse.Namespace) -> int:
    from mpi4py import MPI
    import hpccl
    world = MPI.COMM_WORLD
    n = world.size
    cores = world.gather(sorted(os.sched_getaffinity(0)))  # each rank's cores (--bind core: one each)
    if world.rank == 0:
        print(f"cores per rank: {cores}", flush=True)
    comms = {}
    names = tuple(args.paths.split(","))
    for name in names:
        if name == "engine-method":
            assert "engine" in names, "--paths engine-method needs engine (its communicator)"
            continue
        os.environ["HPCCL_NET"] = name.split("-")[0]  # read when the communicator picks its network transport
        os.environ["HPCCL_NET_HOT_SIZE"] = "0" if name == "engine-py" else str(256 << 10)  # and its compiled path
        comms[name] = hpccl.Communicator(world.Dup())
        impl = [getattr(t, "impl", t.name) for t in comms[name]._transports]
        assert comms[name].num_nodes == n and impl == ["engine"], impl
        assert (type(comms[name]._hot).__name__ == "NetHot") == (name == "engine"), name
    rows = []
    for coll in args.colls.split(","):
        for nbytes in [int(v) for v in args.sizes.split(",")]:
            count = max(1, nbytes // 4)
            x = np.full(count, world.rank + 1, np.float32)
            times = {k: [] for k in names + ("mpi",)}
            reps = args.reps if nbytes < (16 << 20) else max(3, args.reps // 3)
            iters = args.iters if nbytes < (1 << 20) else 1  # back to back: the barrier's skew amortised
            # each library's output buffer made once and refilled before every call (a stale result still
            # fails the check; its pages are touched before the timed call, as a reused buffer's are)
            outs = {name: np.empty(count * n if coll == "all_gather" else count, np.float32)
                    for name in names + ("mpi",)}
            for _ in range(reps + 1):  # the first round warms up and is dropped
                for name in names + ("mpi",):
                    y = outs[name]
                    y.fill(1 if coll == "broadcast" and world.rank == 0 else -1)
                    world.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        _call(comms, world, name, coll, x, y)
                    dt = (time.perf_counter() - t0) / iters
                    if coll == "all_reduce":
                        ok = np.all(y == np.float32(n * (n + 1) / 2))
                    elif coll == "broadcast":
                        ok = np.all(y == 1)
                    else:
                        ok = all(np.all(y[r * count:(r + 1) * count] == r + 1) for r in range(n))
                    if not ok:
                        raise SystemExit(f"{name} {coll} of {nbytes} B is wrong on rank {world.rank}")
                    times[name].append(world.allreduce(dt, op=MPI.MAX))
            med = {k: statistics.median(v[1:]) for k, v in times.items()}
            rows.append({"coll": coll, "bytes": nbytes, **{f"{k}_s": v for k, v in med.items()}})
            if world.rank == 0:
                r = rows[-1]
                print(f"{coll:>11} {nbytes:>10}" + "".join(f"  {k} {r[k + '_s'] * 1e6:>7.0f}us" for k in names)
                      + f"  MPI {r['mpi_s'] * 1e6:>7.0f}us" + "".join(f"  {k}/MPI {r[k + '_s'] / r['mpi_s']:5.2f}"
                                                                   for k in names), flush=True)
    if world.rank == 0 and args.json:
        Path(args.json).write_text(json.dumps({"ranks": n, "paths": list(names), "cores": cores, "rows": rows},
                                              indent=1))
    for c in comms.values():
        c.destroy()
    return 0


def launcher(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "net")]
    from nethosts import bench_on_hosts
    return bench_on_hosts(__file__, args.hosts, ["--reps", str(args.reps), "--iters", str(args.iters), "--paths",
                                                 args.paths, "--colls", args.colls, "--sizes", args.sizes]
                          + (["--json", args.json] if args.json else []), env={"HPCCL_CHECK_ENV": "0"},
                          timeout=1500, launch=["--bind-to", "core"] if args.bind == "core" else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--iters", type=int, default=20,
                    help="calls timed back to back per round below 1 MiB (1: one call after a barrier)")
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="message sizes in bytes, comma-separated")
    ap.add_argument("--paths", default="engine", help=f"hpccl's paths, comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--bind", choices=("none", "core"), default="none",
                    help="core: mpiexec --bind-to core (a core per rank); none: the scheduler places the threads")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    bad = [p for p in a.paths.split(",") if p not in PATHS]
    if bad:
        ap.error(f"--paths: {', '.join(bad)} not one of {', '.join(PATHS)}")
    return ranks(a) if a.ranks else launcher(a)


if __name__ == "__main__":
    sys.exit(main())
