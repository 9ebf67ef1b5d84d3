"""Where the stream-synchronised protocol's time goes (issue 32): per all_reduce, the GPU time (CUDA events
around back-to-back calls) and the host time to issue one, for spinning kernels, the full protocol, the
protocol with a bounded look before each wait (HPCCL_CUDA_SYNC_SPIN), and the protocol's kernels alone or
its stream memory operations alone (wrong results, timing only). Run under mpirun on one GPU."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np


def main() -> int:
    import cupy as cp

    import hpccl
    from hpccl.gpu import gpu_sync
    from hpccl.gpu.device import rank_device
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    cp.cuda.Device(rank_device(world.Get_rank() % 8, cp.cuda.runtime.getDeviceCount())).use()
    sizes = [8, 64 << 10, 1 << 20, 16 << 20]
    variants = [("spin", {"HPCCL_CUDA_SYNC": "spin"}, None), ("stream", {"HPCCL_CUDA_SYNC": "stream"}, None),
                ("stream, ctypes", {"HPCCL_CUDA_SYNC": "stream", "HPCCL_COMPILED_LAUNCH": "0"}, None),
                ("stream+peek20us", {"HPCCL_CUDA_SYNC": "stream", "HPCCL_CUDA_SYNC_SPIN": "20"}, None),
                ("kernels only", {"HPCCL_CUDA_SYNC": "stream"}, "kernels"),
                ("memops only", {"HPCCL_CUDA_SYNC": "stream"}, "memops")]
    rows = []
    for name, env, strip in variants:
        os.environ.update(env)
        comm = hpccl.Communicator(world.Dup())
        x = cp.ones(4, cp.float32)
        comm.all_reduce(x)
        comm.synchronize()
        eng = comm._dev.engine
        if strip:
            b = eng.builder
            orig = b.one_pass

            def one_pass(*a, _orig=orig, _strip=strip, **k):
                prog = _orig(*a, **k)
                keep = gpu_sync.Batch if _strip == "memops" else gpu_sync.Launch
                prog.steps = [s for s in prog.steps if isinstance(s, keep)]
                return prog
            b.one_pass = one_pass
        st = cp.cuda.Stream(non_blocking=True)
        for nb in sizes:
            x = cp.ones(max(1, nb // 4), cp.float32)
            cp.cuda.get_current_stream().synchronize()
            for _ in range(10):
                comm.all_reduce(x, stream=st)
            st.synchronize()
            world.Barrier()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            iters = 50
            e0.record(st)
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(x, stream=st)
            host = (time.perf_counter() - t0) / iters
            e1.record(st)
            e1.synchronize()
            gpu = cp.cuda.get_elapsed_time(e0, e1) / iters * 1e3
            g = max(world.allgather(gpu))
            h = max(world.allgather(host * 1e6))
            rows.append({"variant": name, "ranks": world.Get_size(), "bytes": nb, "gpu_us": round(g, 1),
                         "host_us": round(h, 1), "sync": "stream" if eng.safe else "spin"})
            if world.Get_rank() == 0:
                print(f"{name:16s} {world.Get_size()} ranks {nb:>9d} B: {g:8.1f} us per call on the GPU stream, "
                      f"{h:6.1f} us to issue", flush=True)
        try:
            comm.synchronize()
        except hpccl.HpcclError:
            pass
        comm.destroy()
        for k in env:
            del os.environ[k]
    if world.Get_rank() == 0 and len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
