"""One rank skips a collective: the others must fail within HPCCL_TIMEOUT naming it, never hang."""
import json
import sys
import time

import numpy as np

import hpccl
from hpccl import config

comm = hpccl.init()
n, r = comm.size, comm.rank
skipper = n - 1
algo = sys.argv[1] if len(sys.argv) > 1 else ""
if algo and not algo.startswith("hot-"):
    comm._planner.force("all_reduce", algo)
comm.all_reduce(np.ones(1000))  # collective #1: everyone
result = {"rank": r}
if r == skipper:
    time.sleep(config.get("HPCCL_TIMEOUT") + 2)
else:
    t0 = time.monotonic()
    try:
        # collective #2: the skipper never comes (a small one for the compiled hot path; a broadcast of 1 MiB
        # an all_reduce of 1 MiB or an all_gather of 256 KiB per rank for its direct path between processes)
        if algo == "hot-bcast":
            comm.broadcast(np.ones(1 << 17), 0)
        elif algo == "hot-ar":
            comm.all_reduce(np.ones(1 << 17))
        elif algo == "hot-ag":
            comm.all_gather(np.ones(1 << 15), np.empty(n << 15))
        else:
            comm.all_reduce(np.ones(100 if algo == "hot" else 1 << 16))
        result["error"] = None
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, message=str(exc), code=exc.code,
                      missing=getattr(exc, "missing", None))
    result["seconds"] = time.monotonic() - t0
    try:
        comm.all_reduce(np.ones(3))
    except hpccl.HpcclInvalidUsage as exc:
        result["after"] = str(exc)
print("RESULT " + json.dumps(result), flush=True)
comm.destroy()
