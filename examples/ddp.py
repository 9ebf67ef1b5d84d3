"""A small model trained with DistributedDataParallel on the "hpccl" backend.

    mpiexec -n 2 python examples/ddp.py               # or: srun -n 8 python examples/ddp.py
    torchrun --nproc-per-node=2 examples/ddp.py       # no MPI launcher: hpccl bootstraps from torch's store

CUDA tensors when a GPU is visible (one per rank), CPU tensors otherwise. Prints the loss every 10 steps
on rank 0."""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import hpccl.torch as ht


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--width", type=int, default=256)
    a = p.parse_args()
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        dist.init_process_group("hpccl")
    else:
        ht.init_process_group()
    rank = dist.get_rank()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, a.width), torch.nn.GELU(), torch.nn.Linear(a.width, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(device))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 + rank)
    for step in range(a.steps):
        x = torch.randn(32, 64, generator=g).to(device)
        y = torch.randint(0, 10, (32,), generator=g).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} ({dist.get_world_size()} ranks, {device})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
