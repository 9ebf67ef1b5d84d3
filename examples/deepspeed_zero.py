"""DeepSpeed ZeRO (stage 2 or 3) on the "hpccl" backend: a small MLP, synthetic data, 20 steps, fp32, CPU.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node=2 examples/deepspeed_zero.py --stage 3
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 examples/deepspeed_zero.py --stage 3
    DS_ACCELERATOR=cpu mpiexec -n 2 python examples/deepspeed_zero.py --stage 3

``import hpccl.torch`` registers the backend; ``deepspeed.init_distributed(dist_backend="hpccl")`` makes it
the default group's backend, and ZeRO's reduce-scatters, all-gathers and all-reduces go through it. Under
mpiexec DeepSpeed reads the ranks from MPI itself (mpi4py; MASTER_PORT 29500). Rank 0 prints every step's
loss (of its own batch), then ``backend <name> world <n> zero_stage <s>``: the backend of the default group
and the ZeRO stage DeepSpeed ran. ``--backend gloo`` runs the same on gloo; the losses are the same.
The first run JIT-builds DeepSpeed's CPU shm op (about a minute on 2 cores; cached in ~/.cache/torch_extensions).

DeepSpeed's CPU launcher (``deepspeed``) sets LOCAL_SIZE, and with it DeepSpeed's CPU shared-memory all-reduce
creates ``/dev/shm/deepspeed_allreduce_buffer_*`` files that it does not remove
(torchrun and mpiexec do not set LOCAL_SIZE, so none are made there); delete them after the run."""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import hpccl.torch  # noqa: F401  (registers "hpccl")
import deepspeed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, choices=(2, 3), default=2)
    p.add_argument("--backend", choices=("hpccl", "gloo"), default="hpccl")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1)  # the deepspeed launcher passes it
    a = p.parse_args()
    deepspeed.init_distributed(dist_backend=a.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 1))
    config = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": a.stage,
            "reduce_bucket_size": 8192,               # several buckets even for this small model
            "allgather_bucket_size": 8192,
            "stage3_param_persistence_threshold": 0,  # stage 3: partition every parameter, gather each step
        },
        "zero_allow_untested_optimizer": True,        # a torch optimizer rather than DeepSpeed's own
    }
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    g = torch.Generator().manual_seed(1000 + rank)
    for step in range(a.steps):
        x = torch.randn(16, 32, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
    if rank == 0:
        stage = engine.zero_optimization_stage()
        print(f"backend {dist.get_backend()} world {dist.get_world_size()} zero_stage {stage}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
