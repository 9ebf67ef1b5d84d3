"""The single-copy floor of a host collective on this machine: one memcpy of the message (numpy.copyto,
median of 50) per size, to set hpccl-perf's broadcast and all_gather times (hpccl and the MPI library)
against. A one-copy schedule cannot beat it, so it bounds what any library's large-message ratio can be.
Run: python bench/copy_floor.py [sizes...]"""
import sys
import time

import numpy as np

sizes = [int(s) for s in sys.argv[1:]] or [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
for n in sizes:
    a = np.ones(n // 4, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    ts = []
    for _ in range(50):
        t = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t)
    med = sorted(ts)[len(ts) // 2]
    print(f"memcpy {n:>10} B: {med * 1e6:8.1f} us  {n / med / 1e9:6.2f} GB/s")
