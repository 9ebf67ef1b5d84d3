"""One rank fails between collectives (its communicator aborts): the others, inside the next collective,
must fail fast with HpcclRemoteError naming it, long before HPCCL_TIMEOUT."""
import ctypes
import json
import time

import numpy as np

import hpccl

comm = hpccl.init()
n, r = comm.size, comm.rank
failing = n - 1
comm.all_reduce(np.ones(1000))  # collective #1: everyone
result = {"rank": r}
if r == failing:
    time.sleep(0.3)  # the others are inside collective #2 by now
    comm.abort()     # what a failed call does to its communicator
    time.sleep(3)
else:
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(1 << 16))  # collective #2: the failing rank never joins
        result["error"] = None
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, message=str(exc), code=exc.code)
    result["seconds"] = time.monotonic() - t0
shm = next((t for t in comm._transports if hasattr(t, "gpu_error_word")), None)
if shm is not None:  # the word this rank's GPU kernels would poll: every local abort sets it
    result["gpu_word"] = ctypes.c_uint32.from_address(shm.gpu_error_word()).value
print("RESULT " + json.dumps(result), flush=True)
comm.destroy()
