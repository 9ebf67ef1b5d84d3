"""Registered (zero-copy) against staged GPU collectives, side by side in one run: all_reduce through the
staged kernels and the zero-copy kernels on the same buffers; broadcast and all_gather also through the
copy engines. Modes alternate per round and the median of the rounds is reported (GPU time per call from
CUDA events on the caller's stream; every rank starts a round together). Checks each mode's result.
Run: mpirun -n 2 python bench/registered.py [--sizes 64K,1M,16M,64M,256M] [--json FILE]"""
import argparse
import json

import cupy
import numpy as np

import hpccl
from hpccl.config import _size

ap = argparse.ArgumentParser()
ap.add_argument("--sizes", default="64K,1M,16M,64M,256M")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--json", default="")
args = ap.parse_args()

comm = hpccl.init()
n, me = comm.size, comm.rank
s = cupy.cuda.Stream(non_blocking=True)
comm.all_reduce(cupy.ones(4, dtype=cupy.float32), stream=s)
comm.synchronize()
eng = comm._dev.engine
rows = []


def timed(fn, iters):
    comm.synchronize()
    comm.mpi_comm.Barrier()
    fn()  # warm
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record(s)
    for _ in range(iters):
        fn()
    b.record(s)
    b.synchronize()
    return cupy.cuda.get_elapsed_time(a, b) * 1e3 / iters  # us


for nbytes in [_size(t) for t in args.sizes.split(",")]:
    count = nbytes // 4
    iters = max(3, min(200, (256 << 20) // max(nbytes, 1) // 4))
    x = cupy.full(count, me + 1, dtype=cupy.float32)
    y = cupy.zeros(count, dtype=cupy.float32)
    g = cupy.zeros(count * n, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    comm.register(x)
    comm.register(y)
    comm.register(g)
    # mode: (HPCCL_CUDA_ZERO_COPY, HPCCL_CUDA_CE_SIZE) as the engine holds them
    modes = {"staged": (-1, 0), "zerocopy": (0, 0), "ce": (0, 1)}
    calls = {
        "all_reduce": lambda: comm.all_reduce(x, y, stream=s),
        "broadcast": lambda: comm.broadcast(x, 0, recvbuf=y, stream=s),
        "all_gather": lambda: comm.all_gather(x, g, stream=s),
    }
    for coll, fn in calls.items():
        got = {m: [] for m in modes if m != "ce" or coll != "all_reduce"}
        for _ in range(args.rounds):
            for m in got:
                eng.zero_copy_min, eng.ce_min = modes[m]
                eng._fast.clear()  # no staged launch snapshot replays in a zero-copy mode
                got[m].append(timed(fn, iters))
                s.synchronize()
                if coll == "all_reduce":
                    ok = float(y.min()) == float(y.max()) == n * (n + 1) / 2
                elif coll == "broadcast":
                    ok = float(y.min()) == float(y.max()) == 1.0
                else:
                    ok = all(float(g[r * count]) == r + 1 and float(g[(r + 1) * count - 1]) == r + 1 for r in range(n))
                assert ok, f"{coll} {m} {nbytes} gave a wrong result"
                y.fill(0)
                g.fill(0)
        med = {m: float(np.median(v)) for m, v in got.items()}
        row = {"collective": coll, "bytes": nbytes, **{f"{m}_us": round(v, 2) for m, v in med.items()},
               **{f"{m}/staged": round(v / med["staged"], 3) for m, v in med.items() if m != "staged"}}
        rows.append(row)
        if me == 0:
            print(json.dumps(row), flush=True)
    comm.deregister(x)
    comm.deregister(y)
    comm.deregister(g)
if me == 0 and args.json:
    with open(args.json, "w") as f:
        json.dump({"ranks": n, "rows": rows}, f, indent=1)
comm.destroy()
