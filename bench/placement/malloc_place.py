"""Where numpy/glibc put hpccl-perf's buffers: address % 4096 of send = fill(...) and recv = np.empty(...)
made one after the other (as hpccl/cli/perf.py does), and (recv - send) % 4096. fill() allocates and frees
big temporaries (np.arange int64 is 2x-8x the buffer); glibc raises its mmap threshold to the size of each
freed mmap'd chunk (up to 32 MiB), so from then on buffers come from the brk heap, back to back:
recv = send + nbytes + 16, i.e. (recv - send) % 4096 == 16, inside rep movsb's slow window (1..32) on this
CPU. Run: python malloc_place.py  (and with MALLOC_MMAP_THRESHOLD_=65536, which pins the threshold)."""
import numpy as np

from hpccl.cli.workloads import fill
from hpccl.ops import SUM

print("fresh np.empty(512K) % 4096 =", np.empty(128 << 10, np.float32).ctypes.data % 4096)
keep = []
for nbytes in (512 << 10, 2 << 20, 8 << 20):
    s = fill(nbytes // 4, np.dtype(np.float32), 0, SUM)
    r = np.empty(nbytes // 4, np.float32)
    keep += [s, r]
    d = r.ctypes.data - s.ctypes.data
    print(f"{nbytes >> 10:>6}K send%4096={s.ctypes.data % 4096:<5} recv%4096={r.ctypes.data % 4096:<5} "
          f"recv-send={d} ((recv-send)%4096={d % 4096})")
