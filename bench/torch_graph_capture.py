"""Capturing a torch dist.all_reduce on hpccl in a CUDA graph, each capture mode, with and without a warm-up
call on the capture stream; each capture is replayed twice and checked. CUDA tensors, one GPU per rank or
ranks sharing one (MPS).

    mpirun -n 2 python bench/torch_graph_capture.py
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

import hpccl.torch as ht


def main() -> None:
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(local % torch.cuda.device_count())
    ht.init_process_group(device_id=torch.device("cuda", torch.cuda.current_device()))
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.set_default_device("cuda")

    def data() -> torch.Tensor:
        return torch.arange(5, dtype=torch.float32) + rank
    want = sum(torch.arange(5, dtype=torch.float32) + r for r in range(n)) * n  # two replays
    for mode, warm in (("global", False), ("global", True), ("thread_local", False)):
        dist.barrier()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        t = data()
        if warm:
            with torch.cuda.stream(side):
                dist.all_reduce(t)
            torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        label = f"{mode}, {'after a warm-up call' if warm else 'first call on the stream'}"
        try:
            with torch.cuda.graph(graph, stream=side, capture_error_mode=mode):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            t.copy_(data())
            graph.replay()
            graph.replay()
            torch.cuda.synchronize()
            print(rank, label, "OK" if torch.equal(t, want) else f"WRONG {t.tolist()}", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported, then the next mode is not tried
            print(rank, label, "FAILED", type(exc).__name__, str(exc).splitlines()[0][:200], flush=True)
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
