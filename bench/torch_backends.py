"""torch.distributed on "hpccl" against NCCL (gloo where ranks share a GPU, or on CPU), both backends in one
process and one run, calls interleaved: what issue 22 measures.

Rows (median of REPS interleaved repetitions, from the slowest rank):
  host_us      host time per synchronous dist.all_reduce (8 B), the loop timed by the host clock
  b2b          back-to-back dist.all_reduce per size, timed by CUDA events on the caller's stream
  sync         dist.all_reduce + torch.cuda.synchronize() per call, wall clock
  inplace      in-place dist.all_reduce of 256 MiB (event timed)
  ddp / fsdp   a training step of the 50M-parameter MLP (12 x Linear(2048, 2048) + GELU, batch 64) under
               DistributedDataParallel / fully_shard (FSDP2), wall clock with a synchronize per step
--trace DIR writes torch.profiler tables (and gzipped Chrome traces) of 3 DDP steps per backend.

    torchrun --nproc-per-node=1 bench/torch_backends.py [--json out.json] [--trace DIR]
    mpirun -n 4 python bench/torch_backends.py          (ranks share one GPU: against gloo, under MPS)
    mpirun -n 2 -x HPCCL_NODE_ID=split:1 tests/scripts/nccl_hostid.sh python bench/torch_backends.py --baseline nccl
                                                        (2 "nodes" on one GPU: against NCCL's sockets)
"""
from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import shutil
import statistics
import time

import torch
import torch.distributed as dist

import hpccl.torch as ht
from torch_bench import _timed  # bench/ is the script's directory

REPS = 5


def _slowest(v: float, cpu_group: object) -> float:
    x = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=cpu_group)
    return x.item()


def _events(fn, iters: int) -> float:
    return _timed(fn, iters, True)  # CUDA events on the caller's stream


def _host(fn, iters: int, cuda: bool) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    if cuda:
        torch.cuda.synchronize()
    return dt


def _sync(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def _mlp(dev: str) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [m for _ in range(12) for m in (torch.nn.Linear(2048, 2048), torch.nn.GELU())]
    return torch.nn.Sequential(*layers).to(dev)


class _Trainer:
    """A DDP or FSDP2 step of the MLP on one group (built once, timed per repetition)."""

    def __init__(self, kind: str, group: object, dev: str) -> None:
        model = _mlp(dev)
        if kind == "ddp":
            self.model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        else:
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard
            mesh = DeviceMesh.from_group(group, dev.split(":")[0])
            for m in model:
                if isinstance(m, torch.nn.Linear):
                    fully_shard(m, mesh=mesh)
            self.model = fully_shard(model, mesh=mesh)
        self.group = group
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(64, 2048, device=dev, generator=torch.Generator(dev).manual_seed(1))
        self.cuda = dev.startswith("cuda")

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=False)
        self.model(self.x).square().mean().backward()
        self.opt.step()
        if self.cuda:
            torch.cuda.synchronize()


def _sizes(lo: int, hi: int, f: int) -> list:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= f
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--largest", default="16M", help="largest all_reduce of the per-size rows")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per repetition")
    p.add_argument("--train", default="ddp,fsdp", help="training steps to time (comma list; empty: none)")
    p.add_argument("--no-calls", action="store_true", help="time the training steps only (no per-call rows)")
    p.add_argument("--baseline-first", action="store_true",
                   help="build the baseline's model before hpccl's (an allocation-order A/B)")
    p.add_argument("--baseline", choices=("auto", "nccl", "gloo"), default="auto",
                   help="auto: NCCL when every rank has a GPU of its own, else gloo; nccl with ranks sharing a "
                        "GPU needs NCCL_HOSTID per rank (tests/scripts/nccl_hostid.sh: NCCL then sees nodes)")
    p.add_argument("--json", default="")
    p.add_argument("--trace", default="", help="directory for profiler tables of DDP steps")
    p.add_argument("--probe", action="store_true", help="time hpccl's Python inside DDP steps (per call)")
    a = p.parse_args()
    cuda = a.device == "cuda"
    torch.set_num_threads(1)
    init = {}
    launched_by_mpi = "RANK" not in os.environ
    if cuda:
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local % torch.cuda.device_count())
        init["device_id"] = torch.device("cuda", torch.cuda.current_device())
    if launched_by_mpi:
        ht.init_process_group(**init)
    else:
        dist.init_process_group("hpccl", **init)
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    base = a.baseline if a.baseline != "auto" else "nccl" if cuda and n <= torch.cuda.device_count() else "gloo"
    cpu_group = dist.new_group(backend="gloo")
    groups = {"hpccl": dist.group.WORLD, base: cpu_group if base == "gloo" else dist.new_group(backend=base)}
    out: dict = dict(ranks=n, torch=torch.__version__, baseline=base, device=a.device,
                     gpu=torch.cuda.get_device_name() if cuda else "", date=time.strftime("%Y-%m-%d"), rows=[])

    def measure(label: str, make, timer) -> dict:
        res: dict = {}
        for _ in range(REPS):
            for name, g in groups.items():  # interleaved: both libraries see the same machine state
                fn = make(g)
                fn()
                if cuda:
                    torch.cuda.synchronize()
                dist.barrier(group=cpu_group)
                res.setdefault(name, []).append(timer(fn))
        tm = {k: _slowest(statistics.median(v), cpu_group) for k, v in res.items()}
        spread = {k: (min(v), max(v)) for k, v in res.items()}
        row = dict(measure=label, hpccl_us=tm["hpccl"] * 1e6, base_us=tm[base] * 1e6,
                   ratio=tm["hpccl"] / tm[base], hpccl_range_us=[x * 1e6 for x in spread["hpccl"]],
                   base_range_us=[x * 1e6 for x in spread[base]])
        out["rows"].append(row)
        if rank == 0:
            print(f"{label:<34} {row['hpccl_us']:>11.1f} {row['base_us']:>11.1f} {row['ratio']:>7.2f}", flush=True)
        return row

    if rank == 0:
        print(f"# torch {torch.__version__}, {n} rank(s), {out['gpu'] or 'CPU'}: hpccl vs {base}, fp32 sum, "
              f"median of {REPS} interleaved repetitions, slowest rank", flush=True)
        print(f"{'measure':<34} {'hpccl us':>11} {base + ' us':>11} {'ratio':>7}", flush=True)
    if not a.no_calls:
        t8 = torch.zeros(2, device=dev)
        measure("host time per call, 8 B", lambda g: (lambda: dist.all_reduce(t8, group=g)),
                lambda fn: _host(fn, 2000, cuda))
        measure("async + get_future + wait, 8 B",  # DDP's path per bucket (its reducer calls from C++)
                lambda g: (lambda: dist.all_reduce(t8, group=g, async_op=True).get_future().wait()),
                lambda fn: _host(fn, 1000, cuda))
        largest = int(float(a.largest.rstrip("MK")) * (1 << 20 if a.largest.endswith("M") else 1 << 10))
        for size in _sizes(8, largest, 16):
            t = torch.zeros(max(1, size // 4), device=dev)
            iters = max(20, min(1000, int(4e9 / size))) if cuda else max(5, min(500, int(2e7 / size)))
            if cuda:
                measure(f"back-to-back, {size} B", lambda g, t=t: (lambda: dist.all_reduce(t, group=g)),
                        lambda fn, it=iters: _events(fn, it))
                measure(f"+ synchronize, {size} B", lambda g, t=t: (lambda: dist.all_reduce(t, group=g)),
                        lambda fn, it=max(20, iters // 4): _sync(fn, it))
            else:
                measure(f"all_reduce, {size} B", lambda g, t=t: (lambda: dist.all_reduce(t, group=g)),
                        lambda fn, it=iters: _host(fn, it, False))
        if cuda:
            big = torch.zeros(64 << 20, device=dev)
            measure("in place, 256 MiB", lambda g: (lambda: dist.all_reduce(big, group=g)), lambda fn: _events(fn, 20))
            del big
    kinds = [k for k in a.train.split(",") if k and (k != "fsdp" or base != "gloo" or not cuda)]
    if kinds:  # FSDP2 needs reduce_scatter, which gloo lacks on CUDA tensors
        for kind in kinds:
            built = {name: _Trainer(kind, g, dev)
                     for name, g in (reversed(groups.items()) if a.baseline_first else groups.items())}
            trainers = {name: built[name] for name in groups}
            _steps(f"{kind} step, 50M MLP", trainers, a.steps * REPS, out, base, cpu_group, rank)
            if a.trace:
                _trace(kind, trainers, a.trace, rank, cuda)
            if a.probe and kind == "ddp":
                _probe(trainers, a.steps, rank)
            del trainers
            gc.collect()
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()
    gc.collect()


def _steps(label: str, trainers: dict, count: int, out: dict, base: str, cpu_group: object, rank: int) -> None:
    """Training steps alternated one by one between the backends, the order reversed every other round
    (a drifting clock or GPU state, and going first or second, then affect both alike); the median step
    per backend, from the slowest rank, and the spread."""
    times: dict = {name: [] for name in trainers}
    for tr in trainers.values():
        for _ in range(3):
            tr.step()
    dist.barrier(group=cpu_group)
    order = list(trainers.items())
    for i in range(count):
        for name, tr in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            tr.step()
            times[name].append(time.perf_counter() - t0)
    tm = {k: _slowest(statistics.median(v), cpu_group) for k, v in times.items()}
    q = {k: (sorted(v)[len(v) // 10], sorted(v)[-1 - len(v) // 10]) for k, v in times.items()}
    row = dict(measure=label, hpccl_us=tm["hpccl"] * 1e6, base_us=tm[base] * 1e6, ratio=tm["hpccl"] / tm[base],
               hpccl_range_us=[x * 1e6 for x in q["hpccl"]], base_range_us=[x * 1e6 for x in q[base]],
               steps=count)
    out["rows"].append(row)
    if rank == 0:
        print(f"{label:<34} {row['hpccl_us']:>11.1f} {row['base_us']:>11.1f} {row['ratio']:>7.2f}   (median of "
              f"{count} alternated steps; 10-90%: hpccl {q['hpccl'][0] * 1e6:.0f}-{q['hpccl'][1] * 1e6:.0f}, "
              f"{base} {q[base][0] * 1e6:.0f}-{q[base][1] * 1e6:.0f})", flush=True)


def _probe(trainers: dict, steps: int, rank: int) -> None:
    """Where hpccl's DDP step time goes: host time inside its allreduce, Work.get_future and torch's
    _extract_tensors (which pickles a Python future's value to find its tensors), per call; then the step
    with _extract_tensors short-cut for lists of tensors, beside the baseline's step."""
    import torch._jit_internal as ji
    from hpccl.torch.process_group import HpcclProcessGroup
    from hpccl.torch.work import Work
    spent: dict = {}

    def timed(owner, name):
        orig = getattr(owner, name)

        def wrapper(*args, **kw):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kw)
            finally:
                s = spent.setdefault(name, [0, 0.0])
                s[0] += 1
                s[1] += time.perf_counter() - t0
        setattr(owner, name, wrapper)
        return orig

    def steps_of(tr) -> float:
        tr.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            tr.step()
        return (time.perf_counter() - t0) / steps
    hp, base = trainers["hpccl"], next(v for k, v in trainers.items() if k != "hpccl")
    saved = [(o, n, timed(o, n)) for o, n in ((HpcclProcessGroup, "allreduce"), (Work, "get_future"),
                                              (ji, "_extract_tensors"))]
    step = steps_of(hp)
    for owner, name, orig in saved:
        setattr(owner, name, orig)
    orig = ji._extract_tensors

    def fast(obj):
        if type(obj) is list and all(isinstance(t, torch.Tensor) for t in obj):
            return list(obj)
        return orig(obj)
    ji._extract_tensors = fast
    short = steps_of(hp)
    ji._extract_tensors = orig
    plain, other = steps_of(hp), steps_of(base)
    if rank == 0:
        print(f"# probe: hpccl DDP step {step * 1e6:.0f} us timed, {plain * 1e6:.0f} us plain, "
              f"{short * 1e6:.0f} us with _extract_tensors short-cut; baseline {other * 1e6:.0f} us; inside, per "
              "step: " + ", ".join(f"{k} {v[0] / (steps + 1):.1f} x {v[1] / max(v[0], 1) * 1e6:.1f} us"
                                   for k, v in spent.items()), flush=True)


def _trace(kind: str, trainers: dict, where: str, rank: int, cuda: bool) -> None:
    """torch.profiler of 3 steps per backend: a table by self CUDA (or CPU) time, and the Chrome trace; the
    hpccl group's calls replayed by its compiled backend during them are counted in the table's file."""
    from torch.profiler import ProfilerActivity, profile
    os.makedirs(where, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for name, tr in trainers.items():
        tr.step()
        pg = getattr(tr, "group", None)
        before = getattr(pg, "replays", None)
        with profile(activities=acts) as prof:
            for _ in range(3):
                tr.step()
        if rank == 0:
            key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            with open(os.path.join(where, f"{kind}_{name}.txt"), "w") as f:
                if before is not None:
                    f.write(f"# {type(pg).__name__}: {pg.replays - before} calls replayed by the compiled "
                            "backend in these 3 steps\n")
                avg = prof.key_averages()
                f.write(avg.table(sort_by=key, row_limit=25, max_name_column_width=60))
                if cuda:  # and where the host's time goes
                    f.write("\n" + avg.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
            tmp = os.path.join(where, f"{kind}_{name}.json")
            prof.export_chrome_trace(tmp)
            with open(tmp, "rb") as src, gzip.open(tmp + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(tmp)


if __name__ == "__main__":
    main()
