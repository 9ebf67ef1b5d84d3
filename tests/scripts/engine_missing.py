"""Run under mpiexec with HPCCL_NODE_ID=split:1: the native network engine made unimportable (as on a
machine where it could not be built); the communicator must still work across nodes on the slower path,
warn once naming the fix, and insist with HPCCL_NET=engine. Prints one 'RESULT {json}' per rank."""
import json
import logging
import os
import sys

import numpy as np
from mpi4py import MPI  # noqa: F401 - MPI first, as applications do

sys.modules["hpccl._netengine"] = None  # import hpccl._netengine now raises ImportError
import hpccl  # noqa: E402

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger("hpccl").addHandler(Keep())
out = {"rank": MPI.COMM_WORLD.Get_rank()}
comm = hpccl.init()
x = np.full(1000, comm.rank + 1.0)
comm.all_reduce(x)
out.update(ok=bool(np.all(x == sum(range(1, comm.size + 1)))), nodes=comm.num_nodes,
           impl=[getattr(t, "impl", t.name) for t in comm._transports],
           warnings=[m for m in records if "network engine is not in use" in m])
comm.destroy()
os.environ["HPCCL_NET"] = "engine"
try:
    hpccl.init().destroy()
    out["insist"] = None
except hpccl.HpcclError as exc:
    out["insist"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out), flush=True)
