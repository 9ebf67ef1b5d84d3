"""The last rank is SIGSTOPped before collective #2: the others time out naming it, shrink the communicator
to exclude it and run 20 more collectives on the survivors, checked; then rank 0 lets the stopped rank go on."""
import json
import os
import signal
import time

import numpy as np

import hpccl

comm = hpccl.init()
n, r = comm.size, comm.rank
stopped = n - 1
pids = comm._boot.allgather(os.getpid())
comm.all_reduce(np.ones(1000))  # collective #1: everyone
if r == stopped:
    os.kill(os.getpid(), signal.SIGSTOP)
    print("RESULT " + json.dumps({"rank": r, "resumed": True}), flush=True)
    comm.destroy()  # then MPI finalizes with the others (a rank that skips it makes the launcher kill all)
    raise SystemExit(0)
result = {"rank": r}
t0 = time.monotonic()
try:
    comm.all_reduce(np.ones(1 << 16))  # collective #2: the stopped rank never comes
except hpccl.HpcclError as exc:
    result.update(error=type(exc).__name__, missing=getattr(exc, "missing", None), message=str(exc))
result["seconds"] = time.monotonic() - t0
new = comm.shrink([stopped])
m, q = new.size, new.rank
good = 0
for i in range(20):
    x = np.full(100 + i, q + i, dtype=np.float64)
    new.all_reduce(x)
    g = new.all_gather(np.array([q * 10 + i]))
    b = np.full(3, q, dtype=np.int32)
    new.broadcast(b, root=i % m)
    good += bool(np.all(x == sum(k + i for k in range(m))) and np.array_equal(g.ravel(), np.arange(m) * 10 + i)
                 and np.all(b == i % m))
result.update(new_size=m, new_rank=q, good=good)
new.destroy()
if r == 0:
    os.kill(pids[stopped], signal.SIGCONT)
comm.destroy()
print("RESULT " + json.dumps(result), flush=True)
