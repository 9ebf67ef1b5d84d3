"""Bandwidth of hpccl's network engine alone (hpccl/csrc/_netengine.c over UCX), no GPU and no schedule: 2 ranks
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
ap.add_argument("--lanes", type=int, default=1, help="engines (UCP workers, each with its own thread) per rank")
a = ap.parse_args()
comm = hpccl.init()
t = comm._table.find("engine")
engs = [t.eng]
for _ in range(a.lanes - 1):  # more engines, connected like the communicator's own (an experiment for lanes)
    from hpccl.transport.engine import _ne
    cfg = dict(t.wire, **({"TLS": t.tls} if t.tls != "all" else {}))
    e = _ne.Engine(comm.rank, comm.size, cfg)
    addrs = comm.mpi_comm.allgather(e.address())
    e.connect(list(addrs), [True] * comm.size)
    engs.append(e)
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
        ops = [engs[i % len(engs)].recv(peer, y[i * part:(i + 1) * part]) for i in range(k)]
        ops += [engs[i % len(engs)].send(peer, x[i * part:(i + 1) * part]) for i in range(k)]
        for op in ops:
            assert op.wait(30)
        if rep:
            ts.append(time.perf_counter() - t0)
    t = statistics.median(ts)
    if comm.rank == 0:
        print(f"{len(engs)} lane(s): {a.mb} MiB as {k:>2} message(s) each way: {t * 1e3:8.2f} ms  {n / t / 1e9:6.2f} GB/s per direction",
              flush=True)
for e in engs[1:]:
    e.close()
comm.destroy()
