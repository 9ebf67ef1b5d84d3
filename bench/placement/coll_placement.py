"""Time hpccl and MPICH (mpi4py) host collectives on the same buffers, placed differently in memory.
Run: mpiexec -n 2 python bench/placement/coll_placement.py [sizes...]   (bytes of each rank's send buffer)
Buffer kinds (send and recv alike, float32, values written once before timing so no first touch is timed):
  fill    hpccl-perf's buffers: workloads.fill() for send, np.empty for recv (glibc heap / mmap chunk)
  empty   np.empty (fresh process: mmap chunk, addr%4096 == 16; after big frees: heap, any offset)
  align   np.empty with room, then a view starting at the next 4096 boundary
  mmap    mmap.mmap(MAP_PRIVATE|MAP_ANONYMOUS) + np.frombuffer (page aligned, no glibc)
  huge    mmap over-allocated to a 2 MiB boundary + madvise(MADV_HUGEPAGE)
  skewK   send page aligned, recv page aligned + K bytes (skew16 reproduces fill's heap layout, where recv
          is malloc'd right after send: recv - send == size + 16, so (recv - send) % 4096 == 16)
Also prints minor page faults per call (hpccl, MPI) and the process's AnonHugePages (kB) after allocation.
Each iteration: barrier, hpccl call, barrier, MPI call (interleaved); the time of a call is the slowest
rank's; prints the median over ITERS (env, default 20) after 3 warmups, and each buffer's address % 4096."""
import mmap
import os
import resource
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccl
from hpccl.cli.workloads import fill
from hpccl.ops import SUM

world = MPI.COMM_WORLD
rank, n = world.rank, world.size
comm = hpccl.init()
ITERS = int(os.environ.get("ITERS", 20))
keep = []  # the mmaps behind the mmap/huge arrays


def make(kind, nbytes, salt):
    cnt = nbytes // 4
    if kind == "fill":
        return fill(cnt, np.dtype(np.float32), rank, SUM, salt) if salt == 0 else np.empty(cnt, np.float32)
    if kind == "empty":
        return np.empty(cnt, np.float32)
    if kind == "align":
        raw = np.empty(nbytes + 4096, np.uint8)
        off = (-raw.ctypes.data) % 4096
        return raw[off:off + nbytes].view(np.float32)
    if kind.startswith("skew"):
        raw = np.empty(nbytes + 8192, np.uint8)
        off = (-raw.ctypes.data) % 4096 + (int(kind[4:]) if salt else 0)
        return raw[off:off + nbytes].view(np.float32)
    al = (2 << 20) if kind == "huge" else 4096
    m = mmap.mmap(-1, nbytes + al, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: shared anon is shmem, no THP
    keep.append(m)
    a = np.frombuffer(m, np.uint8)
    off = (-a.ctypes.data) % al
    if kind == "huge":
        m.madvise(mmap.MADV_HUGEPAGE, off, nbytes - nbytes % (2 << 20) if nbytes >= (2 << 20) else nbytes)
    return a[off:off + nbytes].view(np.float32)


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(fn, flt):
    world.Barrier()
    f0, t = minflt(), time.perf_counter()
    fn()
    t, f1 = time.perf_counter() - t, minflt()
    flt.append(f1 - f0)
    return world.allreduce(t, MPI.MAX)


def anon_huge_kb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages"):
            return int(line.split()[1])


sizes = [int(s) for s in sys.argv[1:]] or [512 << 10, 2 << 20, 8 << 20]
kinds = os.environ.get("KINDS", "fill,empty,align,mmap,huge").split(",")
colls = os.environ.get("COLLS", "reduce_scatter,all_reduce,broadcast,all_to_all").split(",")
if rank == 0:
    print(f"# {n} ranks, median of {ITERS}; us hpccl / us MPICH; s%4096 r%4096 per rank")
for size in sizes:
    # every kind's buffers exist at once and each iteration visits every kind, so drifting load from other
    # work on the machine hits all kinds alike
    bufs, info = {}, {}
    for kind in kinds:
        send, recv_full = make(kind, size, 0), make(kind, size, 1)
        send[:] = rank + 1
        recv_full[:] = 0
        bufs[kind] = (send, recv_full, recv_full[:size // 4 // n])
        offs = world.allgather((send.ctypes.data % 4096, recv_full.ctypes.data % 4096))
        info[kind] = " ".join(f"{s}/{r}" for s, r in offs) + f" thp {anon_huge_kb()}kB"

    def runs(send, recv_full, recv_rs):
        return {
            "reduce_scatter": (lambda: comm.reduce_scatter(send, recv_rs),
                               lambda: world.Reduce_scatter_block(send, recv_rs, MPI.SUM)),
            "all_reduce": (lambda: comm.all_reduce(send, recv_full), lambda: world.Allreduce(send, recv_full, MPI.SUM)),
            "broadcast": (lambda: comm.broadcast(send if rank == 0 else recv_full, 0, recvbuf=recv_full),
                          lambda: world.Bcast(send if rank == 0 else recv_full, 0)),
            "all_to_all": (lambda: comm.all_to_all(send, recv_full), lambda: world.Alltoall(send, recv_full)),
        }
    fns = {k: runs(*bufs[k]) for k in kinds}
    th = {(k, c): [] for k in kinds for c in colls}
    tm = {(k, c): [] for k in kinds for c in colls}
    fh, fm = {k: [] for k in kinds}, {k: [] for k in kinds}
    for i in range(ITERS + 3):
        for k in kinds:
            for c in colls:
                h, m = fns[k][c]
                a, b = timed(h, fh[k]), timed(m, fm[k])
                if i >= 3:
                    th[k, c].append(a), tm[k, c].append(b)
    for k in kinds:
        line = f"{size >> 10:>6}K {k:>8} {info[k]}"
        for c in colls:
            line += f" | {c[:6]} {np.median(th[k, c]) * 1e6:7.0f} {np.median(tm[k, c]) * 1e6:7.0f}"
        line += f" | flt/call {np.mean(fh[k]):.1f} {np.mean(fm[k]):.1f}"
        if rank == 0:
            print(line, flush=True)
    del bufs, fns
    keep.clear()
