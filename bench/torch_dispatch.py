"""Host time per torch.distributed.all_reduce call on CUDA tensors, hpccl against NCCL, in one process per
GPU: what the ProcessGroup's Python dispatch costs beside the collective (the issue's "measure the Python
dispatch of the ProcessGroup and cut it"). Prints us per call for: hpccl's own call, the hpccl
ProcessGroup method, dist.all_reduce on hpccl, dist.all_reduce on NCCL; then a cProfile of the hpccl path.

    torchrun --nproc-per-node=N bench/torch_dispatch.py [--calls 3000] [--bytes 8]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import torch
import torch.distributed as dist

import hpccl.torch  # noqa: F401 - registers the backend


def per_call(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return host * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--bytes", type=int, default=8)
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("hpccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    rank, n = dist.get_rank(), dist.get_world_size()
    nccl = dist.new_group(backend="nccl")
    pg = dist.group.WORLD
    t = torch.zeros(max(1, a.bytes // 4), device="cuda")
    comm = pg.comm
    rows = {
        "hpccl Communicator.all_reduce (current stream)": lambda: comm.all_reduce(t),
        "hpccl ProcessGroup.allreduce + wait()": lambda: pg.allreduce([t]).wait(),
        "dist.all_reduce, hpccl": lambda: dist.all_reduce(t),
        "dist.all_reduce, nccl": lambda: dist.all_reduce(t, group=nccl),
        "dist.all_reduce(async_op=True), hpccl": lambda: dist.all_reduce(t, async_op=True),
        "dist.all_reduce(async_op=True), nccl": lambda: dist.all_reduce(t, group=nccl, async_op=True),
    }
    res = {}
    for rep in range(3):
        for name, fn in rows.items():
            dist.barrier(group=nccl)
            res.setdefault(name, []).append(per_call(fn, a.calls))
    if rank == 0:
        print(f"# torch {torch.__version__}, {n} rank(s), {torch.cuda.get_device_name()}, fp32 all_reduce of "
              f"{t.numel() * 4} B: host us per call (median of 3 x {a.calls} back-to-back calls)")
        for name, v in res.items():
            print(f"{sorted(v)[1]:8.2f}  {name}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        dist.all_reduce(t)
    prof.disable()
    torch.cuda.synchronize()
    if rank == 0:
        print("# cProfile of dist.all_reduce on hpccl (cumulative, top 25)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    del nccl, pg
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
