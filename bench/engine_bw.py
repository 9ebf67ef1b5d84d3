"""Bandwidth of hpccl's network engine alone (hpccl/_netengine.c over UCX), no GPU and no schedule: 2 ranks
on 2 nodes (HPCCL_NODE_ID=split:1 on one machine, or real nodes) swap MSG bytes both ways at once, cut into
K messages posted together, REPS times; GB/s per direction (median). Tells the wire and the engine apart
from the staging and the schedule of a collective.

    mpirun -n 2 -x HPCCL_NODE_ID=split:1 python bench/engine_bw.py [--mb 16] [--reps 10]
"""
import argparse
import statistics
import time

import numpy as np

import hpccl

ap = argparse.ArgumentParser()
ap.add_argument("--mb", type=int, default=16)
ap.add_argument("--reps", type=int, default=10)
a = ap.parse_args()
comm = hpccl.init()
eng = comm._table.find("engine").eng
peer = 1 - comm.rank
n = a.mb << 20
x = np.ones(n, np.uint8)
y = np.zeros(n, np.uint8)
for k in (1, 4, 16):
    part = n // k
    ts = []
    for rep in range(a.reps + 1):
        comm.barrier()
        t0 = time.perf_counter()
        ops = [eng.recv(peer, y[i * part:(i + 1) * part]) for i in range(k)]
        ops += [eng.send(peer, x[i * part:(i + 1) * part]) for i in range(k)]
        for op in ops:
            assert op.wait(30)
        if rep:
            ts.append(time.perf_counter() - t0)
    t = statistics.median(ts)
    if comm.rank == 0:
        print(f"{a.mb} MiB as {k:>2} message(s) each way: {t * 1e3:8.2f} ms  {n / t / 1e9:6.2f} GB/s per direction",
              flush=True)
comm.destroy()
