"""One rank's process dies (SIGKILL) inside a collective: the survivors must fail at once with
HpcclRemoteError naming it, not after HPCCL_TIMEOUT. The ranks are plain processes started by the test
(RANK, SIZE, STORE_DIR), bootstrapped over a directory used as a key-value store, so no launcher tears
the survivors down when a rank dies (MPICH's hydra kills them even with -disable-auto-cleanup)."""
import json
import os
import signal
import sys
import time

import numpy as np

import hpccl
from hpccl.bootstrap import StoreBootstrap
from dirstore import DirStore  # tests/scripts/dirstore.py


r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
comm = hpccl.Communicator(StoreBootstrap(DirStore(os.environ["STORE_DIR"]), r, n))
victim = n - 1
comm.all_reduce(np.ones(1000))  # collective #1: everyone
if r == victim:
    time.sleep(0.3)  # the others are inside collective #2 by now
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
result = {"rank": r}
try:
    comm.all_reduce(np.ones(1 << 16))  # collective #2: the victim dies instead of joining
    result["error"] = None
except hpccl.HpcclError as exc:
    result.update(error=type(exc).__name__, message=str(exc), code=exc.code, failed=getattr(exc, "rank", None))
result["seconds"] = time.monotonic() - t0
print("RESULT " + json.dumps(result), flush=True)
comm.destroy()
sys.exit(0)
