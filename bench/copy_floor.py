"""The single-copy floor of a host collective on this machine: one memcpy of the message (numpy.copyto,
median of 50) per size, to set hpccl-perf's broadcast and all_gather times (hpccl and the MPI library)
against. A one-copy schedule cannot beat it, so it bounds what any library's large-message ratio can be.
Run: python bench/copy_floor.py [--json FILE] [sizes...]  (FILE: {size: us}, for bench/runs_table.py)"""
import json
import sys
import time

import numpy as np

args = sys.argv[1:]
out = args[args.index("--json") + 1] if "--json" in args else ""
if out:
    del args[args.index("--json"):args.index("--json") + 2]
sizes = [int(s) for s in args] or [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20]
floor = {}
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
    floor[n] = med * 1e6
    print(f"memcpy {n:>10} B: {med * 1e6:8.1f} us  {n / med / 1e9:6.2f} GB/s")
if out:
    json.dump(floor, open(out, "w"))
