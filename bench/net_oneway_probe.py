"""One message one way between 2 hosts, each rank's own time: hpccl's point-to-point call (comm), its network
engine driven directly (eng: one message; splitK: the message as K messages posted together), and the MPI
library (mpi), interleaved in one run. Separates the sender's time (its send ends once UCX has written the
message to the socket) from the receiver's, and the engine from the Python layers above it. Run across
network-namespace hosts (tests/net/nethosts.py), one rank each:

    python3 bench/net_oneway_probe.py [--cases comm,eng,split4,mpi] [--sizes 262144,1048576,4194304] [--reps 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _wait(op) -> None:
    while not op.wait(1.0):
        pass


def ranks(args: argparse.Namespace) -> int:
    from net_pair import pair_comm  # this script's folder leads sys.path
    _MPI, world, comm = pair_comm("net_oneway_probe.py")
    eng = next(t for t in comm._transports if getattr(t, "impl", "") == "engine").eng
    r = world.rank
    cases = args.cases.split(",")
    for nbytes in [int(v) for v in args.sizes.split(",")]:
        x = np.full(nbytes // 4, r + 1, np.float32)
        y = np.empty_like(x)
        res: dict = {}
        for rep in range(args.reps + 1):  # the first round warms up and is dropped
            for case in cases:
                y.fill(-1)
                world.Barrier()
                t0 = time.perf_counter()
                if case == "comm":
                    comm.send(x, 1) if r == 0 else comm.recv(y, 0)
                elif case == "mpi":
                    world.Send(x, 1) if r == 0 else world.Recv(y, 0)
                else:
                    k = 1 if case == "eng" else int(case[5:])
                    parts = np.array_split(x if r == 0 else y, k)
                    for op in [eng.send(1, v) if r == 0 else eng.recv(0, v) for v in parts]:
                        _wait(op)
                dt = time.perf_counter() - t0
                if r == 1 and not np.all(y == 1):
                    raise SystemExit(f"{case} of {nbytes} B is wrong")
                dts = world.allgather(dt)
                if rep:
                    res.setdefault(case, ([], []))
                    res[case][0].append(dts[0])
                    res[case][1].append(dts[1])
        if r == 0:
            print(f"{nbytes:>9} B" + "".join(f"  {c}: send {statistics.median(s) * 1e6:5.0f} us recv "
                                              f"{statistics.median(v) * 1e6:5.0f} us" for c, (s, v) in res.items()),
                  flush=True)
    comm.destroy()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", default="comm,eng,split4,mpi")
    ap.add_argument("--sizes", default="262144,1048576,4194304")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    if a.ranks:
        return ranks(a)
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "net")]
    from nethosts import bench_on_hosts
    return bench_on_hosts(__file__, 2, ["--cases", a.cases, "--sizes", a.sizes, "--reps", str(a.reps)],
                          env={"HPCCL_CHECK_ENV": "0"}, timeout=600)


if __name__ == "__main__":
    sys.exit(main())
