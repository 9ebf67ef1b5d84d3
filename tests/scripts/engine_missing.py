"""Run under mpiexec with HPCCL_NODE_ID=split:1: the native network engine made unimportable (as on a
machine where it could not be built); the communicator must still work across nodes over MPI, warn once
naming why, say so in hpccl-info, and insist with HPCCL_NET=engine (and ucx). Prints one 'RESULT {json}'
per rank; rank 0 also prints hpccl-info's report."""
import json
import logging
import os
import sys

import numpy as np
from mpi4py import MPI  # noqa: F401 - MPI first, as applications do

sys.modules["hpccl._netengine"] = None  # import hpccl._netengine now raises ImportError
import hpccl  # noqa: E402
from hpccl.transport.select import net_path  # noqa: E402

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger("hpccl").addHandler(Keep())
out = {"rank": MPI.COMM_WORLD.Get_rank()}
comm = hpccl.init()
x = np.full(1000, comm.rank + 1.0)
comm.all_reduce(x)
y = np.full(1 << 18, comm.rank + 1.0)  # past the small-message paths: the ring over MPI
comm.all_reduce(y)
out.update(ok=bool(np.all(x == sum(range(1, comm.size + 1))) and np.all(y == sum(range(1, comm.size + 1)))),
           nodes=comm.num_nodes, impl=[getattr(t, "impl", t.name) for t in comm._transports],
           path=net_path(comm), warnings=[m for m in records if "network engine is not in use" in m])
comm.destroy()
for want in ("engine", "ucx"):
    os.environ["HPCCL_NET"] = want
    try:
        hpccl.init().destroy()
        out[f"insist_{want}"] = None
    except hpccl.HpcclError as exc:
        out[f"insist_{want}"] = f"{type(exc).__name__}: {exc}"
del os.environ["HPCCL_NET"]
print("RESULT " + json.dumps(out), flush=True)
from hpccl.cli import info  # noqa: E402

info.main([])  # collective; rank 0 prints the report
