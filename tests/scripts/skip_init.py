"""One rank never calls hpccl.init(): the others fail within HPCCL_TIMEOUT instead of hanging."""
import json
import time

from mpi4py import MPI

import hpccl
from hpccl import config

r, n = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
result = {"rank": r}
if r == n - 1:
    time.sleep(config.get("HPCCL_TIMEOUT") + 1)
else:
    t0 = time.monotonic()
    try:
        hpccl.init()
        result["error"] = None
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, message=str(exc), missing=getattr(exc, "missing", None))
    result["seconds"] = time.monotonic() - t0
print("RESULT " + json.dumps(result), flush=True)
# The dangling Comm_idup would keep MPI_Finalize waiting: rank 0 ends the job, after a pause that lets
# the other waiting ranks print their result first.
time.sleep(1.5)
MPI.COMM_WORLD.Abort(0) if r == 0 else time.sleep(5)
