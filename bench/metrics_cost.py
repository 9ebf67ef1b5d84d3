"""The cost per call of Prometheus metrics (hpccl/observe/metrics.py) on small host calls, side by side in
one run: three communicators over the same ranks, two made with metrics off ("off", "off2": their
difference is the noise) and one with them on ("on": HPCCL_METRICS_FILE, the file rewritten by the
exporter's thread every --interval seconds, and each call's latency bucket counted). Each is timed through
its C front door on the compiled path (as bench/host_door.py times it: entry "door", the latency bucket
counted in C), and the same with the compiled path off (HPCCL_HOT_SIZE=0, HPCCL_NET_HOT_SIZE=0: entry
"python", validated and run by the Python algorithms, the bucket counted in Python), rounds interleaved, the
slowest rank's time per call kept, every result checked:

    mpiexec -n 2 python3 bench/metrics_cost.py [--reps 31] [--iters 2000] [--sizes 8,1024] [--interval 1]
    HPCCL_NODE_ID=split:1 mpiexec -n 2 python3 bench/metrics_cost.py   # the compiled path across nodes

Printed per collective, size and entry: the median over rounds of each communicator, on/off and off2/off,
and the quartiles of on/off and off2/off over the rounds."""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import numpy as np

from host_door import interleaved  # bench/ is the script's folder: sys.path[0]

COLLS = ("all_reduce", "broadcast", "all_gather")


def quartiles(v: list) -> str:
    q = statistics.quantiles(v, n=4)
    return f"[{q[0]:.3f}, {q[2]:.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--sizes", default="8,1024")
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--interval", type=float, default=1.0, help="HPCCL_METRICS_INTERVAL of the 'on' communicator")
    ap.add_argument("--entries", default="door,python", help="door, python or both")
    args = ap.parse_args()
    from mpi4py import MPI
    import hpccl
    from hpccl.observe import metrics
    world = MPI.COMM_WORLD
    for name in ("HPCCL_METRICS_FILE", "HPCCL_METRICS_PORT"):
        os.environ.pop(name, None)
    folder = world.bcast(tempfile.mkdtemp(prefix="hpccl-metrics-cost-") if world.rank == 0 else None)
    os.environ["HPCCL_METRICS_INTERVAL"] = str(args.interval)
    sets = {}
    for entry in args.entries.split(","):
        if entry == "python":
            os.environ["HPCCL_HOT_SIZE"] = os.environ["HPCCL_NET_HOT_SIZE"] = "0"
        off, off2 = hpccl.Communicator(world.Dup()), hpccl.Communicator(world.Dup())
        os.environ["HPCCL_METRICS_FILE"] = folder
        sets[entry] = {"off": off, "off2": off2, "on": hpccl.Communicator(world.Dup())}
        del os.environ["HPCCL_METRICS_FILE"]
        assert [c._rec.stats.latency for c in sets[entry].values()] == [False, False, True]
        assert (sets[entry]["on"]._hot is None) == (entry == "python")
    on = next(iter(sets.values()))["on"]
    n, r = on.size, on.rank
    if r == 0:
        print(f"# {n} ranks, {on.num_nodes} nodes, hot path {type(on._hot).__name__}; reps {args.reps} x "
              f"{args.iters} calls; metrics file rewritten every {args.interval} s", flush=True)
    for coll in args.colls.split(","):
        for entry, comms in sets.items():
            for nbytes in [int(v) for v in args.sizes.split(",")]:
                count = max(1, nbytes // 4)
                x = np.full(count, r + 1, np.float32)
                y = np.empty(count * n if coll == "all_gather" else count, np.float32)
                fns = {k: (c.__dict__.get(coll) if entry == "door" else getattr(c, coll)) for k, c in comms.items()}
                if entry == "door" and any(type(f).__name__ != "FrontDoor" for f in fns.values()):
                    raise SystemExit(f"no C front door for {coll} on this layout")
                times = interleaved(fns, coll, x, y, world, args.reps, args.iters)
                med = {k: statistics.median(v) for k, v in times.items()}
                ron = [a / b for a, b in zip(times["on"], times["off"])]
                r2 = [a / b for a, b in zip(times["off2"], times["off"])]
                if r == 0:
                    print(f"{coll:>11} {nbytes:>6} B {entry:>6}  off {med['off'] * 1e6:6.2f} us  off2 "
                          f"{med['off2'] * 1e6:6.2f} us  on {med['on'] * 1e6:6.2f} us  on/off "
                          f"{med['on'] / med['off']:.3f} {quartiles(ron)}  off2/off {med['off2'] / med['off']:.3f} "
                          f"{quartiles(r2)}", flush=True)
    counted = {e: {row[0] for row in c["on"]._rec.stats.rows()} for e, c in sets.items()}
    calls = sum(row[4] for c in sets.values() for row in c["on"]._rec.stats.rows())
    written = metrics.flush()
    if r == 0:
        print(f"# the 'on' communicators counted {calls} calls on rank 0, by path {counted}; the file {written}: "
              f"{os.path.getsize(written)} bytes", flush=True)
    metrics.shutdown()
    for comms in sets.values():
        for c in comms.values():
            c.destroy()
    world.barrier()
    if r == 0:
        for f in os.listdir(folder):
            os.remove(os.path.join(folder, f))
        os.rmdir(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
