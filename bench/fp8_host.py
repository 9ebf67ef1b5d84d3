"""float8 all_reduce on host buffers against float32 and bfloat16 of the same element count, and float8
all_gather against uint8 (the same bytes), side by side in one run: the cost of widening to float32,
the float32 collective and the one rounding. Median of 5 blocks per case, the slowest rank's, in us.
Run: mpiexec -n 4 python bench/fp8_host.py"""
import time

import numpy as np
from mpi4py import MPI

import hpccl

world = MPI.COMM_WORLD


def timed(fn, calls):
    blocks = []
    for _ in range(5):
        world.Barrier()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append(world.allreduce((time.perf_counter() - t) / calls * 1e6, op=MPI.MAX))
    return sorted(blocks)[2]


def main() -> None:
    comm = hpccl.init()
    f8, bf = hpccl.float8_e4m3fn, hpccl.bfloat16
    if comm.rank == 0:
        print(f"# {comm.size} ranks, {comm.num_nodes} node(s); us per call (median of 5 blocks, slowest rank)")
        print(f"# {'elements':>9} {'f32 ar':>9} {'bf16 ar':>9} {'e4m3 ar':>9} {'e4m3/f32':>8} "
              f"{'u8 ag':>9} {'e4m3 ag':>9} {'e4m3/u8':>8}")
    for count in (256, 4096, 65536, 1 << 20):
        calls = max(5, min(500, (1 << 22) // (count * 4)))
        a32, abf = np.ones(count, np.float32), np.ones(count, bf)
        a8 = np.ones(count, np.float32).astype(f8)
        t32 = timed(lambda: comm.all_reduce(a32, op="max"), calls)
        tbf = timed(lambda: comm.all_reduce(abf, op="max"), calls)
        t8 = timed(lambda: comm.all_reduce(a8, op="max"), calls)
        g8, gu = np.empty(count * comm.size, f8), np.empty(count * comm.size, np.uint8)
        tu = timed(lambda: comm.all_gather(a8.view(np.uint8), gu), calls)
        tg = timed(lambda: comm.all_gather(a8, g8), calls)
        if comm.rank == 0:
            print(f"  {count:>9} {t32:>9.1f} {tbf:>9.1f} {t8:>9.1f} {t8 / t32:>8.2f} {tu:>9.1f} {tg:>9.1f} "
                  f"{tg / tu:>8.2f}", flush=True)
    comm.destroy()


if __name__ == "__main__":
    main()
