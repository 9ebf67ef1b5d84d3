"""Probe of the two-shot all_reduce with 2 ranks sharing one GPU: forces the two-shot kernel there
(bypassing the engine's one-shot fallback) and runs a test's pattern (int8 sum, out of place then in
place) many times in variants, printing each wrong result with both ranks' inputs, so the value read can
be traced to where it came from.
Run: mpirun -n 2 python bench/twoshot_probe.py"""
import cupy
import numpy as np

import hpccl

comm = hpccl.init()
me, n = comm.rank, comm.size
comm.all_reduce(cupy.ones(4, dtype=cupy.float32))
comm.synchronize()
comm._planner.force("all_reduce", "twoshot")


def value(r, c, i):
    return (7 * r + 3 * c + i) % 50 + 1


def run(variant, count, calls):
    bad = []
    for c in range(calls):
        data = [np.array([value(r, c, i) for i in range(count)], dtype=np.int8) for r in range(n)]
        want = sum(d.astype(np.int64) for d in data).astype(np.int8)
        x = cupy.asarray(data[me])
        if variant == "sync":
            cupy.cuda.runtime.deviceSynchronize()
            comm.mpi_comm.Barrier()
        if variant != "inplace_only":
            y = cupy.zeros(count, dtype=cupy.int8)
            comm.all_reduce(x, y)
            got = cupy.asnumpy(y)
            if (got != want).any():
                bad.append(("out", c, got[:4].tolist(), want[:4].tolist()))
        if variant == "sync":
            cupy.cuda.runtime.deviceSynchronize()
            comm.mpi_comm.Barrier()
        comm.all_reduce(x)
        got = cupy.asnumpy(x)
        if (got != want).any():
            bad.append(("in", c, got[:4].tolist(), want[:4].tolist(), [d[:4].tolist() for d in data]))
    comm.synchronize()
    return bad


for variant in ("plain", "sync", "inplace_only"):
    for count in (1, 13, 4099):
        bad = run(variant, count, 100)
        allbad = comm.mpi_comm.gather(bad)
        if me == 0:
            print(f"{variant:<13} n={count:<5} wrong: rank0 {len(allbad[0])}/100 rank1 {len(allbad[1])}/100", flush=True)
            for r, b in enumerate(allbad):
                for item in b[:3]:
                    print(f"    rank {r}: {item}", flush=True)
comm.destroy()
