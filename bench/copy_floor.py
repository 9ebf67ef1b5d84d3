"""The single-copy floor of a host collective on this machine: one memcpy of the message (numpy.copyto,
median of 50, between page-aligned buffers as hpccl-perf's are: docs/PERFORMANCE.md "Buffer placement")
per size, to set hpccl-perf's broadcast and all_gather times (hpccl and the MPI library) against. A
one-copy schedule cannot beat it, so it bounds what any library's large-message ratio can be.

With --procs N it also times N processes copying at once, each its own message, started together on a
barrier per iteration (the slowest process's time per iteration, median): in an all_gather every rank
writes its whole output at the same time, so the node's shared caches and memory bound it by this floor,
not by one process's.
Run: python bench/copy_floor.py [--procs N] [--json FILE] [sizes...]
(FILE: {size: us} or, with --procs, {"1": {size: us}, "N": {size: us}}, for bench/runs_table.py)"""
import argparse
import json
import multiprocessing as mp
import time

import numpy as np

ITERS = 50


def aligned(n: int) -> np.ndarray:
    raw = np.empty(n + 4096, np.uint8)
    off = -raw.ctypes.data % 4096
    return raw[off:off + n]


def copy_times(n: int, barrier=None) -> list:
    a, b = aligned(n), aligned(n)
    a[:] = 1
    np.copyto(b, a)
    ts = []
    for _ in range(ITERS):
        if barrier is not None:
            barrier.wait()
        t = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t)
    return ts


def _worker(n: int, barrier, q) -> None:
    q.put(copy_times(n, barrier))


def concurrent(n: int, procs: int) -> float:
    """Median over iterations of the slowest of ``procs`` processes copying n bytes each at once (s)."""
    barrier, q = mp.Barrier(procs), mp.Queue()
    ps = [mp.Process(target=_worker, args=(n, barrier, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    per = [q.get() for _ in ps]
    for p in ps:
        p.join()
    worst = sorted(max(col) for col in zip(*per))
    return worst[len(worst) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20])
    ap.add_argument("--procs", type=int, default=1, help="also time this many processes copying at once")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    one, many = {}, {}
    for n in a.sizes:
        ts = sorted(copy_times(n))
        one[n] = ts[len(ts) // 2] * 1e6
        line = f"memcpy {n:>10} B: {one[n]:8.1f} us {n / one[n] / 1e3:6.2f} GB/s"
        if a.procs > 1:
            many[n] = concurrent(n, a.procs) * 1e6
            line += f" | {a.procs} processes at once: {many[n]:8.1f} us {n / many[n] / 1e3:6.2f} GB/s each"
        print(line, flush=True)
    if a.json:
        json.dump({"1": one, str(a.procs): many} if a.procs > 1 else one, open(a.json, "w"))


if __name__ == "__main__":
    main()
