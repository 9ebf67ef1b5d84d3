"""PyTorch Lightning's DDP on the "hpccl" backend: a small regression model, synthetic data, 20 steps.

    python examples/lightning_ddp.py --devices 2                 # Lightning starts the second process itself
    torchrun --nproc-per-node=2 examples/lightning_ddp.py --devices 2
    mpiexec -n 2 python examples/lightning_ddp.py --devices 2    # or srun -n 2 (Lightning reads the launcher)

What selects hpccl is ``DDPStrategy(process_group_backend="hpccl")`` after ``import hpccl.torch``; the same
line serves GPUs (``--accelerator gpu``). Rank 0 prints every step's loss, then the backend of the default
group, which says "hpccl" when hpccl carried the gradients. ``--backend gloo`` runs the same on gloo."""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import hpccl.torch  # noqa: F401 - registers the "hpccl" backend
import lightning as L
from lightning.pytorch.strategies import DDPStrategy


class Regressor(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def training_step(self, batch, _index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.global_rank == 0:
            print(f"step {self.global_step} loss {loss.item()!r}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--backend", default="hpccl")
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64 * a.steps, 32, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=32)  # Lightning shards it per rank
    trainer = L.Trainer(accelerator=a.accelerator, devices=a.devices, max_steps=a.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        strategy=DDPStrategy(process_group_backend=a.backend))
    trainer.fit(Regressor(64), loader)
    if trainer.global_rank == 0:
        print(f"backend {dist.get_backend()} world {dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
