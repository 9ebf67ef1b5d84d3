"""hpccl-perf: the nccl-tests of hpccl. Times each collective over a size sweep, checks results against
numpy, and times the MPI library / gloo / NCCL on the same buffers in the same run.

    mpiexec -n 4 hpccl-perf all_reduce -b 8 -e 64M -f 2 --check --compare mpi
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..config import _size
from ..ops import DTYPES, FP8_NAMES
from ..text import block, one_line
from .workloads import COLLECTIVES, OPS, ROOTED, expected, fill, workload, wrong


def _say(text: str = "", **kw: Any) -> None:
    """print() of plain text: the header and table carry strings from MPI and the baselines' libraries."""
    print(block(text), **kw)


def _args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpccl-perf", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collectives", nargs="*", default=["all_reduce"],
                   help=f"any of {', '.join(COLLECTIVES)}, or 'all'")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (8, 64K, 1M...)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="multiply the size by this each step")
    p.add_argument("-n", "--iters", type=int, default=0, help="timed iterations per size (0: 64 MB worth, 20 to 200, as nccl-tests times 20 by default)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations per size")
    p.add_argument("-d", "--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("-o", "--op", default="sum", choices=list(OPS))
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-c", "--check", action="store_true", help="check every result against numpy")
    p.add_argument("--compare", default="", help="comma list of baselines: mpi, gloo, nccl")
    p.add_argument("--algo", default="", help="comma list of hpccl algorithms to time separately "
                                              "(as HPCCL_ALGO); empty: the cost model's choice")
    p.add_argument("--mem", default="host", choices=["host", "cuda"], help="buffer memory")
    p.add_argument("--host-alloc", default="hpccl", choices=["hpccl", "numpy"],
                   help="hpccl's host buffers: from comm.alloc_host, mapped by every local peer (default), or "
                        "page-aligned numpy arrays of each rank's own heap; the libraries compared always get "
                        "the latter")
    p.add_argument("--json", default="", help="write every result to this file")
    p.add_argument("--plot", default="", help="draw busbw against size per library to this PNG")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="at the end, print each rank's comm.stats() (calls, bytes, seconds per collective and "
                        "algorithm)")
    a = p.parse_args(argv)
    if a.collectives == ["all"]:
        a.collectives = list(COLLECTIVES)
    for c in a.collectives:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c!r}; use {', '.join(COLLECTIVES)} or all")
    if a.stepfactor < 2:
        p.error("--stepfactor must be >= 2")
    return a


def _sizes(lo: int, hi: int, f: int) -> List[int]:
    out, s = [], max(lo, 0)
    while s <= hi:
        out.append(s)
        s = s * f if s else 1
    return out


def _iters(nbytes: int, given: int) -> int:
    """Timed calls per size: as given, else about 64 MB moved, never fewer than 20 (one slow call among
    3 made a large row read 3x slower) nor more than 200."""
    if given:
        return given
    return max(20, min(200, int(64e6 / max(nbytes, 1))))


class _Mem:
    """Allocation and host transfer for the chosen buffer memory (numpy or CuPy)."""

    def __init__(self, kind: str, local_rank: int, comm: Any = None, words: Optional[np.dtype] = None) -> None:
        self.kind, self.comm = kind, comm  # comm: host buffers come from comm.alloc_host
        self.words = words if kind == "cuda" else None  # a float8 type CuPy holds as uint8 words
        self._held: List[Any] = []
        if kind == "cuda":
            import cupy
            self.cp = cupy
            from hpccl.gpu.device import rank_device
            cupy.cuda.Device(rank_device(local_rank, cupy.cuda.runtime.getDeviceCount())).use()

    def put(self, a: np.ndarray) -> Any:
        if self.kind == "cuda":
            return self.cp.asarray(a.view(np.uint8) if self.words is not None else a)
        out = self.empty(a.size, a.dtype)
        out[...] = a
        return out

    def get(self, a: Any) -> np.ndarray:
        if self.kind != "cuda":
            return a
        return self.cp.asnumpy(a).view(self.words) if self.words is not None else self.cp.asnumpy(a)

    def empty(self, n: int, dtype: np.dtype) -> Any:
        """A buffer of n elements; host buffers start on a page, as nccl-tests' and OSU's do, so every
        library timed gets the same placement (two heap buffers malloc'd back to back sit 16 bytes past a
        page apart, where rep-movsb copies crawl on some CPUs: docs/PERFORMANCE.md, "Buffer placement")."""
        if self.kind == "cuda":
            return self.cp.empty(n, dtype=np.uint8 if self.words is not None else dtype)
        if self.comm is not None:
            self._held.append(self.comm.alloc_host(n, dtype))
            return self._held[-1]
        nbytes = n * np.dtype(dtype).itemsize
        raw = np.empty(nbytes + 4096, dtype=np.uint8)
        off = -raw.ctypes.data % 4096
        return raw[off:off + nbytes].view(dtype)

    def release(self) -> None:
        """Give back the alloc_host buffers of one size (collective: every rank made the same ones)."""
        while self._held:
            self.comm.free_host(self._held.pop())

    def sync(self) -> None:
        if self.kind == "cuda":
            self.cp.cuda.get_current_stream().synchronize()


def _hpccl_runner(comm, coll: str, send: Any, recv: Any, op, root: int,
                  counts: Any = None, dtype: Optional[str] = None) -> Callable[[], None]:
    """``dtype``: the float8 type of 1-byte words (CuPy's), which the reductions are told."""
    kw = {"dtype": dtype} if dtype else {}
    if coll == "all_reduce":
        return lambda: comm.all_reduce(send, recv, op, **kw)
    if coll == "all_gather":
        return lambda: comm.all_gather(send, recv)
    if coll == "reduce_scatter":
        return lambda: comm.reduce_scatter(send, recv, op, **kw)
    if coll == "broadcast":
        return lambda: comm.broadcast(send if comm.rank == root else recv, root, recvbuf=recv)
    if coll == "reduce":
        return lambda: comm.reduce(send, recv, root, op, **kw)
    if coll == "all_to_all":
        return lambda: comm.all_to_all(send, recv)
    if coll == "gather":
        return lambda: comm.gather(send, recv, root)
    if coll == "scatter":
        return lambda: comm.scatter(send, recv, root)
    if coll == "all_gather_v":
        return lambda: comm.all_gather_v(send, recv, counts)
    if coll == "reduce_scatter_v":
        return lambda: comm.reduce_scatter_v(send, recv, counts, op, **kw)
    raise ValueError(coll)


def _time(run: Callable[[], None], iters: int, warmup: int, mpi_comm, mem: _Mem) -> float:
    """Seconds per call, the slowest rank's (a collective is done when its last rank is)."""
    for _ in range(warmup):
        run()
    mem.sync()
    mpi_comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    mem.sync()
    dt = (time.perf_counter() - t0) / iters
    from mpi4py import MPI
    return mpi_comm.allreduce(dt, op=MPI.MAX)


def main(argv: Optional[List[str]] = None) -> int:
    a = _args(argv)
    from mpi4py import MPI

    import hpccl
    from hpccl import config
    from . import baselines

    world = MPI.COMM_WORLD
    comm = hpccl.init(world)
    n, rank = comm.size, comm.rank
    if not 0 <= a.root < n:
        if rank == 0:
            print(f"hpccl-perf: --root {a.root} is not a rank (0..{n - 1})", file=sys.stderr)
        return 2
    dtype, op = DTYPES[a.dtype], OPS[a.op]
    shared = a.mem == "host" and a.host_alloc == "hpccl"
    words = dtype if a.dtype in FP8_NAMES else None
    # picks this rank's GPU before any baseline initialises
    mem = _Mem(a.mem, comm.local_rank, comm if shared else None, words)
    bmem = _Mem(a.mem, comm.local_rank, None, words) if shared else mem  # the baselines' own: private, page-aligned
    libs: Dict[str, Any] = {}
    for name in filter(None, a.compare.split(",")):
        try:
            libs[name] = baselines.make(name, world)
        except Exception as exc:  # noqa: BLE001 - a missing baseline must not stop the sweep
            if rank == 0:
                _say(f"# baseline {name} unavailable: {type(exc).__name__}: {exc}")
    # Everything imported so far (torch for gloo is large) moves out of the collector's way, so a full
    # collection triggered mid-sweep does not stall one rank for milliseconds and skew that size.
    gc.collect()
    gc.freeze()
    algos = [x for x in a.algo.split(",") if x] or [""]
    tw = max(9, len(a.dtype))  # the type column fits float8_e4m3fn
    say = _say if rank == 0 else (lambda *x, **k: None)
    say(f"# hpccl-perf {hpccl.__version__}: {n} ranks, {comm.num_nodes} node(s), dtype {a.dtype}, "
        f"op {a.op}, mem {a.mem}{' (alloc_host)' if shared else ''}, check {'on' if a.check else 'off'}, MPI "
        f"{one_line(MPI.Get_library_version())}")
    say(f"# communicator set-up {comm.setup_seconds * 1e3:.1f} ms")
    results: List[Dict[str, Any]] = []
    total_wrong = 0
    for coll in a.collectives:
        for algo in algos:
            comm._planner.force(coll, algo or None)
            head = f"{'size':>12} {'count':>12} {'type':>{tw}} {'redop':>6} {'root':>5} {'time(us)':>10} " \
                   f"{'algbw':>7} {'busbw':>7} {'#wrong':>6}"
            for lib in libs:
                head += f" | {lib + ' us':>10} {lib + ' busbw':>11} {'ratio':>6}"
            say(f"#\n# {coll}{' algo ' + algo if algo else ''}")
            for name, lib in libs.items():
                why = getattr(lib, "lacks", lambda c: None)(coll)
                if why:
                    say(f"# {name}: {why}")
            say(f"#{head[1:]}")
            busbws = []
            for size in _sizes(_size(a.minbytes), _size(a.maxbytes), a.stepfactor):
                wl = workload(coll, size, dtype.itemsize, n, rank)
                if wl.count == 0 and size:
                    continue
                send = mem.put(fill(wl.send_count, dtype, rank, op))
                recv = mem.empty(wl.recv_count, dtype)
                if coll == "broadcast":  # every rank allocates alike: alloc_host is collective
                    other = mem.put(fill(wl.recv_count, dtype, rank, op))
                    recv = other if rank != a.root else recv
                it = _iters(wl.size, a.iters)
                told = a.dtype if mem.words is not None else None
                run = _hpccl_runner(comm, coll, send, recv, op, a.root, wl.counts, told)
                t = _time(run, it, a.warmup, world, mem)
                if a.mem == "cuda":
                    comm.synchronize()  # a GPU call that failed asynchronously raises here, named
                bad = 0
                if a.check:
                    recv_h = mem.get(recv)
                    if coll in ("reduce", "gather") and rank != a.root:
                        bad = 0
                    else:
                        bad = wrong(recv_h.reshape(-1), expected(wl, dtype, op, n, rank, a.root), op)
                    bad = world.allreduce(bad)
                    total_wrong += bad
                algbw = wl.size / t / 1e9 if t > 0 else 0.0
                busbw = algbw * wl.busbw_factor
                busbws.append(busbw)
                rec: Dict[str, Any] = dict(coll=coll, algo=algo or "auto", size=wl.size, count=wl.count,
                                           dtype=a.dtype, op=a.op, ranks=n, time_us=t * 1e6, algbw=algbw,
                                           busbw=busbw, wrong=bad if a.check else None, baselines={})
                root = a.root if coll in ROOTED else -1
                line = f"{wl.size:>12} {wl.count:>12} {a.dtype:>{tw}} {a.op:>6} {root:>5} " \
                       f"{t * 1e6:>10.1f} {algbw:>7.3f} {busbw:>7.3f} {bad if a.check else 'N/A':>6}"
                for name, lib in libs.items():
                    bsend = bmem.put(fill(wl.send_count, dtype, rank, op))
                    brecv = bmem.empty(wl.recv_count, dtype)
                    if coll == "broadcast":
                        brecv = bsend if rank == a.root else brecv
                    brun = lib.runner(coll, bsend, brecv, op, a.root, counts=wl.counts,
                                      **({"dtype": told} if told and name == "nccl" else {}))
                    if brun is None or wl.count == 0:
                        line += f" | {'n/a':>10} {'n/a':>11} {'':>6}"
                        continue
                    bt = _time(brun, it, a.warmup, world, bmem)
                    bbus = wl.size / bt / 1e9 * wl.busbw_factor if bt > 0 else 0.0
                    ratio = t and bt / t
                    rec["baselines"][name] = dict(time_us=bt * 1e6, busbw=bbus, ratio=ratio)
                    line += f" | {bt * 1e6:>10.1f} {bbus:>11.3f} {ratio:>6.2f}"
                say(line)
                results.append(rec)
                mem.release()
            if busbws:
                say(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f} GB/s ({coll})")
    if a.check:
        say(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(dict(ranks=n, nodes=comm.num_nodes, config=[(k, str(v), s) for k, v, s, _ in config.describe()],
                           results=results), f, indent=1)
    if rank == 0 and a.plot:
        _plot(results, list(libs), a.plot)
    if a.verbose:
        lines = world.gather(comm._rec.stats.lines())
        if rank == 0:
            for r, ls in enumerate(lines):
                say(f"# comm.stats() of rank {r}")
                for ln in ls:
                    say(f"#   {ln}")
    for lib in libs.values():
        lib.close()
    comm.destroy()
    return 1 if total_wrong else 0


def _plot(results: List[Dict[str, Any]], libs: List[str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colls = sorted({(r["coll"], r["algo"]) for r in results})
    fig, axes = plt.subplots(1, len(colls), figsize=(5 * len(colls), 4), squeeze=False)
    for ax, (coll, algo) in zip(axes[0], colls):
        rows = [r for r in results if r["coll"] == coll and r["algo"] == algo and r["size"] > 0]
        xs = [r["size"] for r in rows]
        ax.plot(xs, [r["busbw"] for r in rows], "o-", label="hpccl")
        for lib in libs:
            pts = [(r["size"], r["baselines"][lib]["busbw"]) for r in rows if lib in r["baselines"]]
            if pts:
                ax.plot(*zip(*pts), "s--", label=lib)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{coll}{'' if algo == 'auto' else ' ' + algo} ({results[0]['ranks']} ranks)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
