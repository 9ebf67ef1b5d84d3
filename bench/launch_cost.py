"""Host time to issue a repeated GPU all_reduce (the launch-snapshot fast path), with the driver calls made
by the compiled extension (hpccl/csrc/_hotpath.c) against the same calls through ctypes, alternating in one run.
Issues fewer calls than the launch queue holds, so the GPU's own time does not enter the host timing.
Run: mpirun -n 2 python bench/launch_cost.py   (one or two GPUs)."""
import time

import cupy
import numpy as np

import hpccl

comm = hpccl.init()
x = cupy.ones(2, dtype=cupy.float32)
for _ in range(20):
    comm.all_reduce(x)
comm.synchronize()
eng = comm._dev.engine
compiled = eng.compiled_launch
assert compiled is not None, "hpccl/csrc/_hotpath.c is not built here, or HPCCL_COMPILED_LAUNCH is 0"
calls, rounds = 200, 10
res = {"compiled": [], "ctypes": []}
for i in range(2 * rounds):
    mode = "compiled" if i % 2 == 0 else "ctypes"
    eng.compiled_launch = compiled if mode == "compiled" else None
    comm.mpi_comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        comm.all_reduce(x)
    res[mode].append((time.perf_counter() - t0) / calls * 1e6)
    comm.synchronize()
eng.compiled_launch = compiled
y = cupy.ones(1000, dtype=cupy.float32)  # both launch routes gave correct results: a final check
for _ in range(3):
    comm.all_reduce(y)
comm.synchronize()
assert float(y[0]) == comm.size ** 3, float(y[0])
med = {k: float(np.median(v)) for k, v in res.items()}
if comm.rank == 0:
    print(f"host us per repeated all_reduce call (median of {rounds} rounds of {calls}): "
          f"compiled launch {med['compiled']:.2f}, ctypes {med['ctypes']:.2f}, "
          f"ratio {med['compiled'] / med['ctypes']:.2f}", flush=True)
comm.destroy()
