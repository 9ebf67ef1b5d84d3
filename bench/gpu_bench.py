#!/usr/bin/env python3
"""hpccl's GPU path against NCCL on the same GPUs, buffers and stream, in one run (mpirun -n 2).

Per size: hpccl launched call by call from Python (what a user gets), hpccl replayed from a CUDA graph
(launch cost removed), NCCL through cupy.cuda.nccl; CUDA-event timing of back-to-back ops after warm-up,
maximum over ranks; busbw as nccl-tests. Prints a side-by-side table; --json writes every row."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402


def parse_size(t):
    t = t.upper().rstrip("B")
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if mul > 1 else t) * mul)


def human(n):
    for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s}{unit}"
    return str(n)


BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sweep", action="store_true", help="all_reduce algorithm x blocks sweep")
    p.add_argument("--parts", default="ar,coll,half,launch", help="which tables")
    a = p.parse_args()
    import cupy
    from mpi4py import MPI
    import hpccl
    from hpccl.cli.nccl_baseline import nccl_comm, nccl_launch
    from hpccl.ops import SUM
    mc = MPI.COMM_WORLD
    rank, n = mc.Get_rank(), mc.Get_size()
    comm = hpccl.Communicator()
    dev = comm.local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(dev).use()
    comm.all_reduce(cupy.ones(1, dtype=cupy.float32))  # builds the GPU side (kernel engine) on every rank
    comm.synchronize()
    eng = comm._dev.engine
    nc = nccl_comm(mc)
    stream = cupy.cuda.Stream(non_blocking=True)
    sp = stream.ptr
    rows = []
    say = (lambda *x: print(*x, flush=True)) if rank == 0 else (lambda *x: None)
    say(f"# hpccl GPU bench: {n} ranks, GPU {cupy.cuda.runtime.getDeviceProperties(dev)['name'].decode()}, "
        f"transport {eng.transport}, slot {eng.args.slot} B, blocks<={eng.maxb}, threads {eng.threads}")

    def timed(fn, iters, warmup):
        for _ in range(warmup):
            fn()
        stream.synchronize()
        mc.Barrier()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        for _ in range(iters):
            fn()
        e1.record(stream)
        e1.synchronize()
        t = cupy.cuda.get_elapsed_time(e0, e1) / 1e3 / iters
        comm.synchronize()
        return mc.allreduce(t, op=MPI.MAX)

    def graph_time(fn, per_graph, reps):
        stream.synchronize()
        comm.barrier(stream=stream)  # order the capture stream after earlier work of the communicator
        stream.synchronize()
        with stream:
            stream.begin_capture()
            for _ in range(per_graph):
                fn()
            g = stream.end_capture()
        return timed(lambda: g.launch(stream), reps, 2) / per_graph

    def iters_for(nbytes):
        return 200 if nbytes <= (1 << 20) else (50 if nbytes <= (64 << 20) else 10)

    dtmap = {"float32": cupy.float32, "float16": cupy.float16}

    def case(coll, nbytes, dtype="float32", graph=True):
        isz = 2 if dtype in ("float16", "bfloat16") else 4
        count = max(1, nbytes // isz)
        if coll in ("all_gather", "reduce_scatter"):
            count = max(n, count // n * n)
        if dtype == "bfloat16":
            import torch
            mk = lambda c, v: torch.full((c,), float(v), dtype=torch.bfloat16, device=f"cuda:{dev}")  # noqa: E731
        else:
            mk = lambda c, v: cupy.full(c, v, dtype=dtmap[dtype])  # noqa: E731
        if coll == "all_reduce":
            x, y = mk(count, rank + 1), mk(count, 0)
            f = lambda: comm.all_reduce(x, y, SUM, stream=stream)  # noqa: E731
            g = lambda: nccl_launch(nc, coll, _p(x), _p(y), count, dtype, sp)  # noqa: E731
        elif coll == "all_gather":
            x, y = mk(count // n, rank + 1), mk(count, 0)
            f = lambda: comm.all_gather(x, y, stream=stream)  # noqa: E731
            g = lambda: nccl_launch(nc, coll, _p(x), _p(y), count // n, dtype, sp)  # noqa: E731
        elif coll == "reduce_scatter":
            x, y = mk(count, rank + 1), mk(count // n, 0)
            f = lambda: comm.reduce_scatter(x, y, SUM, stream=stream)  # noqa: E731
            g = lambda: nccl_launch(nc, coll, _p(x), _p(y), count // n, dtype, sp)  # noqa: E731
        elif coll == "broadcast":
            x, y = mk(count, rank + 1), mk(count, 0)
            f = lambda: comm.broadcast(x, 0, recvbuf=y, stream=stream)  # noqa: E731
            g = lambda: nccl_launch(nc, coll, _p(x), _p(y), count, dtype, sp)  # noqa: E731
        size = count * isz
        it = iters_for(size)
        t_h = timed(f, it, 5)
        ok = _check(coll, y, rank, n)
        t_g = graph_time(f, 20, max(3, it // 20)) if graph and size <= (64 << 20) else None
        t_n = timed(g, it, 5)
        t_ng = graph_time(g, 20, max(3, it // 20)) if graph and size <= (64 << 20) else None
        bw = BUSBW[coll](n)
        row = dict(coll=coll, dtype=dtype, size=size, hpccl_us=t_h * 1e6,
                   hpccl_graph_us=None if t_g is None else t_g * 1e6, nccl_us=t_n * 1e6,
                   nccl_graph_us=None if t_ng is None else t_ng * 1e6,
                   hpccl_busbw=size / t_h / 1e9 * bw, nccl_busbw=size / t_n / 1e9 * bw,
                   algbw=size / t_h / 1e9, ratio=t_n / t_h, correct=bool(mc.allreduce(int(ok), op=MPI.MIN)),
                   algo=_algo(comm, coll, size))
        rows.append(row)
        g_s = f"{row['hpccl_graph_us']:9.1f}" if t_g is not None else f"{'-':>9}"
        ng_s = f"{row['nccl_graph_us']:9.1f}" if t_ng is not None else f"{'-':>9}"
        say(f"{coll:>14} {dtype:>8} {human(size):>6} {row['algo']:>8} {row['hpccl_us']:9.1f} {g_s} "
            f"{row['nccl_us']:9.1f} {ng_s} {row['algbw']:8.1f} {row['hpccl_busbw']:8.1f} {row['nccl_busbw']:8.1f} "
            f"{row['ratio']:6.2f} {'ok' if row['correct'] else 'WRONG'}")
        del x, y
        return row

    head = (f"{'coll':>14} {'dtype':>8} {'size':>6} {'algo':>8} {'hpccl_us':>9} {'graph_us':>9} {'nccl_us':>9} {'nccl_gr':>9} "
            f"{'algbw':>8} {'busbw':>8} {'nccl_bw':>8} {'ratio':>6} check")
    parts = a.parts.split(",")
    if "launch" in parts:
        x = cupy.ones(2, dtype=cupy.float32)
        y = cupy.zeros(2, dtype=cupy.float32)

        def host_cost(fn, n_calls=1000):
            for _ in range(50):
                fn()
            stream.synchronize()
            mc.Barrier()
            t0 = time.perf_counter()
            for _ in range(n_calls):
                fn()
            t1 = time.perf_counter()
            stream.synchronize()
            return mc.allreduce((t1 - t0) / n_calls, op=MPI.MAX)
        hc = host_cost(lambda: comm.all_reduce(x, y, SUM, stream=stream))
        ncost = host_cost(lambda: nccl_launch(nc, "all_reduce", x.data.ptr, y.data.ptr, 2, "float32", sp))
        via = None
        xt = None
        try:
            import torch
            xt = torch.ones(2, device=f"cuda:{dev}")
            yt = torch.zeros(2, device=f"cuda:{dev}")
            tst = torch.cuda.ExternalStream(sp)
            tc = host_cost(lambda: comm.all_reduce(xt, yt, SUM, stream=tst))
        except Exception as exc:  # noqa: BLE001
            tc = None
            say(f"# torch host cost not measured: {exc}")
        say(f"# host time per call (8 B all_reduce, no sync, 1000 calls): hpccl Communicator.all_reduce {hc * 1e6:.2f} us"
            + (f", through Communicator.all_reduce {via * 1e6:.2f} us" if via else "")
            + (f", torch tensors {tc * 1e6:.2f} us" if tc else "")
            + f"; NCCL via CuPy {ncost * 1e6:.2f} us")
        rows.append(dict(coll="launch", hpccl_host_us=hc * 1e6, nccl_host_us=ncost * 1e6,
                         comm_host_us=None if via is None else via * 1e6, torch_host_us=None if tc is None else tc * 1e6))
        del x, y, xt
    if "ar" in parts:
        say("#\n# all_reduce float32 sum\n#" + head[1:])
        sizes = [8, 64, 512, 4 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20,
                 64 << 20, 256 << 20, 1 << 30]
        if a.quick:
            sizes = [8, 64 << 10, 1 << 20, 64 << 20]
        for s in sizes:
            case("all_reduce", s)
    if "coll" in parts:
        for coll in ("all_gather", "reduce_scatter", "broadcast"):
            say(f"#\n# {coll} float32\n#" + head[1:])
            for s in ([64 << 10, 1 << 20, 64 << 20] if a.quick else
                      [8 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20, 256 << 20, 1 << 30]):
                case(coll, s)
    if "half" in parts:
        for dt in ("bfloat16", "float16"):
            say(f"#\n# all_reduce {dt} sum\n#" + head[1:])
            for s in ([1 << 20, 64 << 20] if a.quick else [64 << 10, 1 << 20, 64 << 20, 256 << 20, 1 << 30]):
                case("all_reduce", s, dt)
    if a.sweep:
        say("#\n# sweep: all_reduce float32, forced algorithm x max blocks (host-launched)\n#" + head[1:])
        for algo in ("oneshot", "twoshot"):
            for blocks in (16, 32, 64):
                comm._planner.force("all_reduce", algo)
                eng.set_blocks(blocks)
                say(f"# algo {algo} blocks {blocks}")
                for s in (1 << 20, 8 << 20, 64 << 20, 256 << 20, 1 << 30):
                    r = case("all_reduce", s, graph=False)
                    r["sweep"] = f"{algo}/b{blocks}"
        comm._planner.force("all_reduce", None)
        eng.set_blocks(64)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(dict(ranks=n, transport=eng.transport, rows=rows), f, indent=1)
    comm.destroy()


def _p(x):
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


def _algo(comm, coll, size):
    """The algorithm the one tuner picks for this device call."""
    return comm._planner.plan(coll, size, "cuda").algo


def _check(coll, y, rank, n):
    if hasattr(y, "data_ptr"):
        v = y.float().cpu().numpy()
    else:
        import cupy
        v = cupy.asnumpy(y).astype(np.float64)
    if coll == "all_reduce":
        want = np.full(v.shape, n * (n + 1) / 2)
    elif coll == "all_gather":
        want = np.repeat(np.arange(1, n + 1), v.size // n).astype(np.float64)
    elif coll == "reduce_scatter":
        want = np.full(v.shape, n * (n + 1) / 2)
    else:
        want = np.full(v.shape, 1.0)
    return bool(np.array_equal(v, want))


if __name__ == "__main__":
    main()
