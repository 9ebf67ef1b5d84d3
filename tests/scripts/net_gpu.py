"""CUDA buffers through hpccl's UCX transport, 2 ranks, one GPU each ("each GPU its own node").

Run under mpiexec -n 2; prints 'RESULT {json}' per rank. Checks copy and reduce receives of CuPy arrays for
several dtypes and sizes against numpy, and times one large exchange to show UCX moved device memory
directly (GPU-to-GPU rates are far above what a trip through host memory could give)."""
import json
import time

import numpy as np
from mpi4py import MPI

import cupy as cp

world = MPI.COMM_WORLD
rank, peer = world.rank, 1 - world.rank
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
cp.zeros(1)  # a current context before UCX starts

from hpccl.bootstrap import MpiBootstrap  # noqa: E402
from hpccl.ops import MAX, SUM  # noqa: E402
from hpccl.transport.ucx import UcxTransport  # noqa: E402

t = UcxTransport(MpiBootstrap(world), rank)


def wait(reqs):
    while reqs:
        reqs = [q for q in reqs if not q.test()]


out = {"rank": rank, "device": cp.cuda.Device().id, "tls": t.tls, "checks": 0, "bad": []}
for dtype in (np.float32, np.float64, np.int32, np.float16, np.uint8):
    for n in (1, 1000, 3 << 20):
        mine = (cp.arange(n) % 7 + rank).astype(dtype)
        theirs = (np.arange(n) % 7 + peer).astype(dtype)
        recv = cp.zeros(n, dtype=dtype)
        wait([t.irecv(peer, recv, None), t.isend(peer, mine)])
        ok = np.array_equal(cp.asnumpy(recv), theirs)
        acc = mine.copy()
        wait([t.irecv(peer, acc, SUM), t.isend(peer, mine)])
        ok &= np.array_equal(cp.asnumpy(acc), (np.arange(n) % 7 + rank).astype(dtype) + theirs)
        big = cp.zeros(n, dtype=dtype)
        wait([t.irecv(peer, big, MAX, mine), t.isend(peer, mine)])  # buf = src op incoming
        ok &= np.array_equal(cp.asnumpy(big), np.maximum((np.arange(n) % 7 + rank).astype(dtype), theirs))
        out["checks"] += 3
        if not ok:
            out["bad"].append([np.dtype(dtype).name, n])
for nbytes in (64 << 20, 256 << 20):
    s = cp.ones(nbytes, dtype=cp.uint8)
    r = cp.empty_like(s)
    wait([t.irecv(peer, r, None), t.isend(peer, s)])
    cp.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(10):
        world.Barrier()
        t0 = time.perf_counter()
        wait([t.irecv(peer, r, None), t.isend(peer, s)])
        times.append(time.perf_counter() - t0)
    out[f"GBps_{nbytes >> 20}MiB"] = nbytes / sorted(times)[len(times) // 2] / 1e9
t.close()
print("RESULT " + json.dumps(out), flush=True)
