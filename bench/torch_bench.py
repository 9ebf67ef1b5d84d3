"""torch.distributed.all_reduce through the "hpccl" backend against gloo, same ranks, same tensors, in one
run (CPU tensors, fp32 sum): median time per call and busbw, sizes interleaved per library.

    mpiexec -n 2 python bench/torch_bench.py [--json out.json] [-b 8] [-e 64M] [-f 4]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

import hpccl.torch as ht
from hpccl.config import _size


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("--json", default="")
    a = p.parse_args()
    torch.set_num_threads(1)  # idle OpenMP threads would steal the 2 cores from the other library
    ht.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"hpccl": None, "gloo": gloo}
    rows = []
    size = _size(a.b)
    if rank == 0:
        print(f"# torch {torch.__version__}: dist.all_reduce fp32 sum, {n} ranks, CPU tensors; median of reps")
        print(f"{'bytes':>10} {'hpccl us':>10} {'gloo us':>10} {'hpccl busbw':>12} {'gloo busbw':>11} {'ratio':>6}")
    while size <= _size(a.e):
        t = torch.ones(max(1, size // 4))
        iters = max(5, min(200, int(2e7 / max(size, 1))))
        res = {}
        for rep in range(3):
            for name, g in groups.items():  # interleaved: both libraries see the same machine state
                dist.all_reduce(t, group=g)
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=g)
                dt = (time.perf_counter() - t0) / iters
                res.setdefault(name, []).append(dt)
        med = {k: sorted(v)[1] for k, v in res.items()}
        slow = {k: torch.tensor(v).max().item() for k, v in med.items()}
        tm = {}
        for k, v in slow.items():
            x = torch.tensor([v])
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=gloo)
            tm[k] = x.item()
        nbytes = t.numel() * 4
        bw = {k: 2 * (n - 1) / n * nbytes / v / 1e9 for k, v in tm.items()}
        row = dict(bytes=nbytes, hpccl_us=tm["hpccl"] * 1e6, gloo_us=tm["gloo"] * 1e6, hpccl_busbw=bw["hpccl"],
                   gloo_busbw=bw["gloo"], ratio=tm["gloo"] / tm["hpccl"])
        rows.append(row)
        if rank == 0:
            print(f"{nbytes:>10} {row['hpccl_us']:>10.1f} {row['gloo_us']:>10.1f} {bw['hpccl']:>12.3f} "
                  f"{bw['gloo']:>11.3f} {row['ratio']:>6.2f}", flush=True)
        size *= a.f
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(dict(ranks=n, torch=torch.__version__, rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
