"""One rank of a kill -9 campaign round (RANK, SIZE, STORE_DIR; plain processes over a directory store):
after init it writes a ready file, then runs collectives of random kinds and sizes until one fails (the
test harness SIGKILLs a rank at a random moment); it prints the error, the time it was raised and how many
collectives completed, then exits."""
import json
import os
import sys
import time

import numpy as np

import hpccl
from hpccl.bootstrap import StoreBootstrap
from dirstore import DirStore  # tests/scripts/dirstore.py

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
store = os.environ["STORE_DIR"]
comm = hpccl.Communicator(StoreBootstrap(DirStore(store), r, n))
open(os.path.join(store, f"ready{r}"), "w").close()
rng = np.random.default_rng(int(os.environ.get("SEED", "0")))  # the same sequence of calls on every rank
done, result = 0, {"rank": r}
try:
    while True:
        k = int(rng.integers(0, 4))
        count = int(rng.integers(1, 1 << 14))
        if k == 0:
            x = np.full(count, r + 1, np.float32)
            comm.all_reduce(x)
            assert x[0] == n * (n + 1) / 2
        elif k == 1:
            g = comm.all_gather(np.full(count, r, np.int32))
            assert g.reshape(n, count)[n - 1, 0] == n - 1
        elif k == 2:
            b = np.full(count, r, np.int64)
            comm.broadcast(b, root=done % n)
            assert b[0] == done % n
        else:
            comm.barrier()
        done += 1
except hpccl.HpcclError as exc:
    result.update(error=type(exc).__name__, failed=getattr(exc, "rank", None), message=str(exc)[:300])
result.update(at=time.time(), done=done)
print("RESULT " + json.dumps(result), flush=True)
comm.destroy()
sys.exit(0)
