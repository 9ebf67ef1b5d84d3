"""torch.distributed.all_reduce through the "hpccl" backend against a baseline backend, same ranks, same
tensors, in one run (fp32 sum): median time per call and busbw, sizes interleaved per library.
CPU tensors: against gloo, wall-clock timed. ``--device cuda``: against NCCL (one GPU per rank; gloo where
ranks share a GPU), back-to-back calls timed with CUDA events on the caller's stream, and ``--ddp`` adds the
DDP step time of two MLPs (12 and 24 x Linear(2048, 2048) + GELU, batch 64).

    mpiexec -n 2 python bench/torch_bench.py [--device cuda] [--ddp] [--json out.json] [-b 8] [-e 64M] [-f 4]
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import torch
import torch.distributed as dist

import hpccl.torch as ht
from hpccl.config import _size


def _timed(fn, iters: int, cuda: bool) -> float:
    """Seconds per call of ``iters`` back-to-back calls (CUDA events on the current stream for GPU work)."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _slowest(v: float, gloo: object) -> float:
    x = torch.tensor([v])
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=gloo)
    return x.item()


def _ddp_steps(group: object, layers: int, cuda: bool, steps: int = 20) -> float:
    """Median-free mean DDP step time (forward, backward with bucketed all_reduce, SGD) after 5 warm-up steps."""
    torch.manual_seed(0)
    dev = "cuda" if cuda else "cpu"
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(2048, 2048), torch.nn.GELU())])
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev), process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 2048, device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        ddp(x).square().mean().backward()
        opt.step()
    for _ in range(5):
        step()
    return _timed(step, steps, cuda)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--ddp", action="store_true", help="also time DDP steps of two MLPs")
    p.add_argument("--json", default="")
    a = p.parse_args()
    cuda = a.device == "cuda"
    torch.set_num_threads(1)  # idle OpenMP threads would steal the cores from the other library
    init = {}
    if cuda:
        import os
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local % torch.cuda.device_count())
        init["device_id"] = torch.device("cuda", torch.cuda.current_device())
    ht.init_process_group(**init)
    rank, n = dist.get_rank(), dist.get_world_size()
    base = "nccl" if cuda and n <= torch.cuda.device_count() else "gloo"
    gloo = dist.new_group(backend="gloo")  # for barriers and the timing reduction (CPU tensors)
    groups = {"hpccl": None, base: gloo if base == "gloo" else dist.new_group(backend=base)}
    rows = []
    size = _size(a.b)
    if rank == 0:
        where = f"CUDA tensors, {torch.cuda.get_device_name()}, CUDA-event timed" if cuda else "CPU tensors"
        print(f"# torch {torch.__version__}: dist.all_reduce fp32 sum, {n} ranks, {where}; median of 3")
        print(f"{'bytes':>10} {'hpccl us':>10} {base + ' us':>10} {'hpccl busbw':>12} {base + ' busbw':>11} "
              f"{'time ratio':>10}")
    while size <= _size(a.e):
        t = torch.zeros(max(1, size // 4), device=a.device)
        iters = max(5, min(200 if not cuda else 500, int((2e9 if cuda else 2e7) / max(size, 1))))
        res: dict = {}
        for rep in range(3):
            for name, g in groups.items():  # interleaved: both libraries see the same machine state
                dist.all_reduce(t, group=g)
                if cuda:
                    torch.cuda.synchronize()
                dist.barrier(group=gloo)
                res.setdefault(name, []).append(_timed(lambda: dist.all_reduce(t, group=g), iters, cuda))
        tm = {k: _slowest(sorted(v)[1], gloo) for k, v in res.items()}
        nbytes = t.numel() * 4
        bw = {k: 2 * (n - 1) / n * nbytes / v / 1e9 for k, v in tm.items()}
        row = dict(bytes=nbytes, hpccl_us=tm["hpccl"] * 1e6, base_us=tm[base] * 1e6, hpccl_busbw=bw["hpccl"],
                   base_busbw=bw[base], time_ratio=tm["hpccl"] / tm[base])
        rows.append(row)
        if rank == 0:
            print(f"{nbytes:>10} {row['hpccl_us']:>10.1f} {row['base_us']:>10.1f} {bw['hpccl']:>12.3f} "
                  f"{bw[base]:>11.3f} {row['time_ratio']:>10.3f}", flush=True)
        size *= a.f
    ddp = []
    if a.ddp:
        for layers in (12, 24):
            res = {}
            for rep in range(3):
                for name, g in groups.items():
                    dist.barrier(group=gloo)
                    res.setdefault(name, []).append(_ddp_steps(g, layers, cuda))
            tm = {k: _slowest(sorted(v)[1], gloo) for k, v in res.items()}
            params = layers * (2048 * 2048 + 2048)
            ddp.append(dict(layers=layers, params=params, hpccl_ms=tm["hpccl"] * 1e3, base_ms=tm[base] * 1e3,
                            time_ratio=tm["hpccl"] / tm[base]))
            if rank == 0:
                print(f"# DDP step, {layers} x Linear(2048,2048)+GELU ({params / 1e6:.0f}M parameters), batch 64: "
                      f"hpccl {tm['hpccl'] * 1e3:.2f} ms, {base} {tm[base] * 1e3:.2f} ms, time ratio "
                      f"{tm['hpccl'] / tm[base]:.3f}", flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(dict(ranks=n, torch=torch.__version__, device=a.device, baseline=base, rows=rows, ddp=ddp), f,
                      indent=1)
    dist.destroy_process_group()
    del gloo, groups  # not into interpreter teardown (docs/TORCH.md, known issues)
    gc.collect()


if __name__ == "__main__":
    main()
