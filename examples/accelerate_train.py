"""Hugging Face accelerate on the "hpccl" backend: a small regression model, synthetic data, 20 steps.

    torchrun --nproc-per-node=2 examples/accelerate_train.py
    mpiexec -n 2 python examples/accelerate_train.py            # or srun -n 2
    torchrun --nproc-per-node=2 examples/accelerate_train.py --route accelerate   # GPUs only

accelerate picks its own backend (on CPU it accepts only gloo or mpi), but it adopts a default group that
already exists, so the line that selects hpccl everywhere is ``hpccl.torch.init_process_group()`` before
``Accelerator()``: it reads whichever launcher started the process (``--route init``, the default). On GPUs
under torchrun accelerate's own switch works too: ``--route accelerate`` passes
``InitProcessGroupKwargs(backend=...)`` and lets accelerate create the group. Rank 0 prints every step's
loss, then the backend of the default group ("hpccl"; accelerate's own ``state.backend`` may still say
"gloo" on the first route). ``--backend gloo`` (or nccl) runs the same on that backend."""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import hpccl.torch as ht
from accelerate import Accelerator, InitProcessGroupKwargs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="hpccl")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--route", choices=("init", "accelerate"), default="init")
    a = p.parse_args()
    if a.route == "init":
        ht.init_process_group(a.backend)
        acc = Accelerator(cpu=not torch.cuda.is_available())
    else:
        acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=a.backend)])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64 * a.steps, 32, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=32)  # accelerate shards it per process
    model, opt, loader = acc.prepare(model, opt, loader)
    for step, (xb, yb) in enumerate(loader):
        if step == a.steps:
            break
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if acc.is_main_process:
            print(f"step {step} loss {loss.item()!r}", flush=True)
    if acc.is_main_process:
        print(f"backend {dist.get_backend()} world {dist.get_world_size()} processes {acc.num_processes} "
              f"device {acc.device.type} accelerate_backend {acc.state.backend} type {acc.distributed_type.value}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
