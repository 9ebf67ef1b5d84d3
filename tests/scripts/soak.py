"""Soak: SOAK_OPS mixed collectives (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, barrier),
sizes log-uniform from 0 to 4 MiB, several dtypes, every result checked; resident memory, open file
descriptors and hpccl's /dev/shm entries sampled every 1000 calls. Prints 'RESULT {json}' per rank."""
import json
import os
import time

import numpy as np

import hpccl

comm = hpccl.init()
n, r = comm.size, comm.rank
ops = int(os.environ.get("SOAK_OPS", "100000"))
rng = np.random.default_rng(12345)  # the same calls on every rank
dtypes = [np.float32, np.int32, np.float64, np.int64]
page = os.sysconf("SC_PAGE_SIZE")


def sample(i):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page
    shm = len([e for e in os.listdir("/dev/shm") if e.startswith("hpccl-")]) if os.path.isdir("/dev/shm") else 0
    return dict(op=i, rss=rss, fds=len(os.listdir("/proc/self/fd")), shm=shm)


samples, bad, t0 = [], [], time.monotonic()
for i in range(ops):
    if i % 1000 == 0:
        samples.append(sample(i))
    kind = int(rng.integers(0, 6))
    dt = np.dtype(dtypes[int(rng.integers(0, len(dtypes)))])
    nbytes = int(np.exp(rng.uniform(0, np.log(4 << 20)))) if rng.random() > 0.02 else 0
    count = nbytes // dt.itemsize // n * n  # divisible by n for the blocked collectives
    if kind == 0:
        x = np.full(count, r + 1, dt)
        comm.all_reduce(x)
        ok = np.all(x == n * (n + 1) // 2)
    elif kind == 1:
        c = count // n
        g = comm.all_gather(np.full(c, r, dt))
        ok = np.array_equal(g.reshape(n, c), np.repeat(np.arange(n, dtype=dt), c).reshape(n, c))
    elif kind == 2:
        y = comm.reduce_scatter(np.full(count, r + 1, dt))
        ok = y.size == count // n and np.all(y == n * (n + 1) // 2)
    elif kind == 3:
        root = int(rng.integers(0, n))
        b = np.full(count, r, dt)
        comm.broadcast(b, root=root)
        ok = np.all(b == root)
    elif kind == 4:
        c = count // n
        a = comm.all_to_all(np.repeat(np.arange(n, dtype=dt) + 10 * r, c))
        ok = np.array_equal(a, np.repeat(np.arange(n, dtype=dt) * 10 + r, c))
    else:
        comm.barrier()
        ok = True
    if not ok:
        bad.append((i, kind, str(dt), count))
samples.append(sample(ops))
comm.destroy()
print("RESULT " + json.dumps(dict(rank=r, ops=ops, bad=bad[:10], nbad=len(bad), seconds=time.monotonic() - t0,
                                  samples=samples)), flush=True)
