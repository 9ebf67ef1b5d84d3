"""HPCCL_CHECK=1: matching calls run (checked), then the last rank calls something else; every rank
must raise HpcclInvalidUsage naming the ranks that differ and what each called (never a hang)."""
import json
import time

import numpy as np

import hpccl

comm = hpccl.init()
n, r = comm.size, comm.rank
x = np.ones(100, np.float32)
comm.all_reduce(x)
comm.broadcast(np.zeros(7, np.int32), root=n - 1)
with comm.group():  # sends and receives are not compared (they differ by design)
    comm.send(np.ones(3), (r + 1) % n)
    comm.recv(np.empty(3), (r - 1) % n)
ok = bool(np.all(x == n))
result = {"rank": r, "ok": ok}
t0 = time.monotonic()
try:
    if r == n - 1:
        comm.all_gather(np.ones(25, np.float32))  # 100 B out of 25 x n floats: differs from all_reduce
    else:
        comm.all_reduce(np.ones(100, np.float32))
    result["error"] = None
except hpccl.HpcclError as exc:
    result.update(error=type(exc).__name__, message=str(exc))
result["seconds"] = time.monotonic() - t0
y = np.full(5, r, np.float64)  # the communicator is still usable: the mismatched call moved nothing
comm.all_reduce(y)
result["after"] = bool(np.all(y == n * (n - 1) / 2))
print("RESULT " + json.dumps(result), flush=True)
comm.destroy()
