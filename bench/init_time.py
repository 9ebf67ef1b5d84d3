"""Communicator creation time (the slowest rank's), repeated: `mpiexec -n 4 python bench/init_time.py`."""
import time

from mpi4py import MPI

import hpccl

world = MPI.COMM_WORLD
times = []
for _ in range(5):
    world.Barrier()
    t0 = time.perf_counter()
    comm = hpccl.init()
    dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    times.append(dt)
    comm.destroy()
if world.rank == 0:
    print(f"hpccl.init() on {world.size} ranks: " + ", ".join(f"{t * 1e3:.1f}" for t in times)
          + f" ms (slowest rank per try); best {min(times) * 1e3:.1f} ms, worst {max(times) * 1e3:.1f} ms")
