"""Root cause of the wrong results with 4 and 8 ranks on one GPU (issue 20): kernels of ranks sharing a
GPU that need more blocks resident at once than the GPU holds. Prints each kernel's occupancy (blocks per SM
at the launch's thread count), then runs the two patterns that failed in the quick matrix (reduce of 1 Mi
int64, all_gather of 300001 float64, both with the direct kernels) twice:

  1. sized as hpccl sizes them (at most SMs / ranks-per-GPU blocks per kernel): every result checked;
  2. with that bound lifted (64 blocks per rank, the old sizing): on 4 or 8 ranks sharing one GPU this
     stalls until HPCCL_TIMEOUT (set it short) and raises HpcclTimeoutError, the deadlock itself.

    HPCCL_TIMEOUT=10 mpirun -n 4 python3 bench/residency_probe.py
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))

from hpccl.ops import SUM  # noqa: E402

from gpu_util import assert_close, rank_data, reference, to_dev, to_host  # noqa: E402


def patterns(comm, dev, reps: int) -> None:
    n, me = comm.size, comm.rank
    for k in range(reps):
        data = [rank_data("int64", 1 << 20, r, k, SUM) for r in range(n)]
        x = to_dev(data[me], dev)
        y = to_dev(np.zeros(1 << 20, np.int64), dev)
        comm.reduce(x, y, k % n, SUM)
        comm.synchronize()
        if me == k % n:
            assert_close("int64", to_host(y), reference("int64", SUM, data), f"reduce #{k}")
        g = [rank_data("float64", 300001, r, k, SUM) for r in range(n)]
        out = comm.all_gather(to_dev(g[me], dev))
        comm.synchronize()
        assert_close("float64", to_host(out).reshape(-1), np.concatenate(g), f"all_gather #{k}")


def main() -> int:
    import cupy
    import hpccl
    from hpccl.gpu.device import rank_device
    from hpccl.errors import HpcclError
    comm = hpccl.Communicator()
    dev = rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(dev).use()
    comm.all_reduce(cupy.ones(1, cupy.float32))  # builds the node engine
    eng = comm._dev.engine
    for coll in ("reduce", "all_gather"):
        comm._planner.force(coll, "direct")
    if comm.rank == 0:
        occ = {}
        for name, dt in (("hp_reduce_push<4, 0>", 4), ("hp_allreduce_twoshot<8, 0>", 8), ("hp_copy_push", None),
                         ("hp_p2p", None), ("hp_reg_reduce<8, 0>", 8), ("hp_reg_copy", None)):
            occ[name] = eng.driver.occupancy(eng.kernels.func(name, dt), eng.threads)
        print(f"{comm.size} ranks, {eng.share} per GPU, {eng.peers.sms} SMs, {eng.threads} threads per block",
              flush=True)
        print("blocks per SM (occupancy): " + ", ".join(f"{k} {v}" for k, v in occ.items()), flush=True)
        print(f"resident at once on one GPU at 64 blocks per rank would need "
              f"{64 * eng.share} blocks; the GPU holds {eng.peers.sms * occ['hp_reduce_push<4, 0>']} of "
              f"hp_reduce_push, {eng.peers.sms * occ['hp_copy_push']} of hp_copy_push; hpccl launches at most "
              f"{eng.maxb} per rank ({eng.maxb * eng.share} in all)", flush=True)
    t0 = time.time()
    patterns(comm, dev, 20)
    comm.mpi_comm.Barrier()
    if comm.rank == 0:
        print(f"1. sized by hpccl ({eng.maxb} blocks per rank): 20 x reduce + all_gather correct, "
              f"{time.time() - t0:.2f} s", flush=True)
    eng.block_cap = 64  # the old sizing, for the demonstration only
    eng.set_blocks(64)
    t0 = time.time()
    outcome = "finished, every result correct"
    try:
        patterns(comm, dev, 3)
    except (HpcclError, AssertionError) as exc:
        outcome = f"{type(exc).__name__} after {time.time() - t0:.1f} s: {str(exc)[:200]}"
    outs = comm.mpi_comm.gather(outcome, root=0)
    if comm.rank == 0:
        print(f"2. 64 blocks per rank ({64 * eng.share} in all):", flush=True)
        for r, o in enumerate(outs):
            print(f"   rank {r}: {o}", flush=True)
    try:
        comm.destroy()
    except HpcclError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
