"""A >= 64 MiB all_reduce and all_gather with default buffers (many slots and window halves)."""
from __future__ import annotations

import numpy as np

import hpccl


def test_all_reduce_64mib():
    comm = hpccl.init()
    n, r = comm.size, comm.rank
    count = (64 << 20) // 4 + 3
    x = np.full(count, r + 1, dtype=np.float32)
    x[::4097] = r
    comm.all_reduce(x)
    want = np.full(count, n * (n + 1) / 2, dtype=np.float32)
    want[::4097] = n * (n - 1) / 2
    assert np.array_equal(x, want)
    comm._planner.force("all_reduce", "ring")
    y = np.full(count, 2.0, dtype=np.float32)
    comm.all_reduce(y, op="max")
    assert np.all(y == 2.0)
    g = comm.all_gather(np.full((8 << 20) // 4, r, dtype=np.float32))
    assert all(np.all(g[q] == q) for q in range(n))
    comm.destroy()
