"""On a CPU without x86-64's total store order (aarch64, monkeypatched here) the shared-memory transport is
refused with a warning and MPI carries the node's traffic, results still right; HPCCL_TRANSPORT=shm there is
an HpcclUnsupported error naming the reason."""
import json
import os
import platform

import numpy as np

platform.machine = lambda: "aarch64"  # before hpccl decides on its transports

import hpccl  # noqa: E402
from hpccl.transport.mpi import MpiTransport  # noqa: E402

os.environ.pop("HPCCL_TRANSPORT", None)
comm = hpccl.init()
kinds = sorted({type(t).__name__ for t in comm._prim._transport_of.values() if t is not None})
x = np.arange(10, dtype=np.float64) * (comm.rank + 1)
comm.all_reduce(x)
ok = bool(np.array_equal(x, np.arange(10) * sum(range(1, comm.size + 1))))
comm.destroy()
os.environ["HPCCL_TRANSPORT"] = "shm"
try:
    hpccl.init().destroy()
    forced = None
except hpccl.HpcclUnsupported as exc:
    forced = str(exc)
print("RESULT " + json.dumps({"rank": comm.rank, "transports": kinds, "ok": ok, "forced": forced,
                              "mpi": MpiTransport.__name__}), flush=True)
