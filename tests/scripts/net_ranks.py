"""Run inside each rank of a network test (tests/net): prints one 'RESULT {json}' line per rank.

    net_ranks.py info            init, report the layout and transports, check an all_reduce (4 MiB)
    net_ranks.py devices NAME    set UCX_NET_DEVICES=NAME after MPI is up (so only hpccl sees it), init,
                                 and report the error (or success) and how long it took
"""
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI  # noqa: F401 - MPI first, as applications do

import hpccl

mode = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
out = {"rank": rank, "host": socket.gethostname()}
if mode == "devices":
    os.environ["UCX_NET_DEVICES"] = sys.argv[2]
    t0 = time.monotonic()
    try:
        comm = hpccl.init()
        out.update(error=None, net=[t.name for t in comm._transports])
        x = np.full(1 << 16, rank + 1.0)
        comm.all_reduce(x)
        out["ok"] = bool(np.all(x == sum(range(1, comm.size + 1))))
        comm.destroy()
    except hpccl.HpcclError as exc:
        out.update(error=type(exc).__name__, code=exc.code, message=str(exc))
    out["seconds"] = time.monotonic() - t0
else:
    comm = hpccl.init()
    out.update(node=comm.node, num_nodes=comm.num_nodes, local_rank=comm.local_rank, path=comm._path,
               transports=[t.name for t in comm._transports])
    ucx = [t for t in comm._transports if t.name == "ucx"]
    if ucx:
        out.update(tls=ucx[0].tls, error_handling=ucx[0].error_handling)
    x = np.arange(1 << 20, dtype=np.float32) + rank
    want = np.arange(1 << 20, dtype=np.float32) * comm.size + sum(range(comm.size))
    comm.all_reduce(x)
    out["ok"] = bool(np.array_equal(x, want))
    comm.destroy()
print("RESULT " + json.dumps(out), flush=True)
