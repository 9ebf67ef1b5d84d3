"""Back-to-back small host all_reduce across 'nodes' on one machine (run with HPCCL_NODE_ID=split:1, so
every rank is its own node and talks over the network engine), against the MPI library in the same run:

    HPCCL_NODE_ID=split:1 UCX_TLS=tcp,self MPIR_CVAR_NOLOCAL=1 mpiexec -n 2 python bench/net_latency.py [--bytes 8]

Prints hpccl's and MPI's time per call (mean of --calls calls after --warmup) and which path hpccl used:
the compiled path across nodes (hpccl/csrc/_nethot.c) unless HPCCL_NET_HOT_SIZE=0."""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import hpccl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    a = ap.parse_args()
    w = MPI.COMM_WORLD
    c = hpccl.Communicator(w.Dup())
    x = np.full(max(1, a.bytes // 4), w.rank + 1, np.float32)
    y = np.empty_like(x)

    def per_call(fn) -> float:
        for _ in range(a.warmup):
            fn(x, y)
        w.Barrier()
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn(x, y)
        return (time.perf_counter() - t0) / a.calls

    t_h = per_call(c.all_reduce)
    assert np.all(y == w.size * (w.size + 1) / 2)
    t_m = per_call(w.Allreduce)
    path = "compiled (_nethot.c)" if type(c._hot).__name__ == "NetHot" else "Python schedules"
    t_h, t_m = w.allreduce(t_h, op=MPI.MAX), w.allreduce(t_m, op=MPI.MAX)
    if w.rank == 0:
        print(f"{w.size} ranks, {c.num_nodes} nodes, {x.nbytes} B all_reduce: hpccl {t_h * 1e6:.1f} us/call ({path}), "
              f"MPI {t_m * 1e6:.1f} us/call, ratio {t_h / t_m:.2f}", flush=True)
    c.destroy()


if __name__ == "__main__":
    main()
