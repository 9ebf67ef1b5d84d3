"""Lanes of the network engine on a communicator spanning nodes (tests/net/test_engine_lanes.py): made
collectively, each carries messages of its own, HPCCL_NET_LANES and the automatic choice, an abort reaches
every lane, close frees them. Prints one RESULT record per rank."""
import json
import os
import time

import numpy as np

import hpccl

comm = hpccl.init()
t = comm._table.find("engine")
out = {"rank": comm.rank, "auto": t.auto_lanes(), "cores": len(os.sched_getaffinity(0))}
extra = t.add_lanes(2)
out["lanes"] = len(t.lanes)
peer = 1 - comm.rank
x = np.full(1 << 20, comm.rank + 1, np.uint8)
ys = [np.zeros_like(x) for _ in t.lanes]
ops = [e.recv(peer, y) for e, y in zip(t.lanes, ys)] + [e.send(peer, x) for e in t.lanes]
out["moved"] = all(op.wait(30) for op in ops) and all(bool(np.all(y == peer + 1)) for y in ys)
comm.barrier()
if comm.rank == 0:  # an abort fails what waits on every lane at once (rank 1 stays until then)
    pending = [e.recv(peer, ys[0]) for e in extra]
    t0 = time.monotonic()
    comm.abort()
    codes = []
    for op in pending:
        try:
            op.wait(10)
            codes.append(None)  # completed: it should have failed
        except Exception as exc:  # noqa: BLE001 - EngineError(code, peer, message)
            codes.append(exc.args[0] if exc.args else repr(exc))
    out["abort_s"] = time.monotonic() - t0
    out["codes"] = codes
    out["aborted"] = codes == [3] * len(pending)  # E_ABORT on every lane
comm.mpi_comm.Barrier()
print("RESULT " + json.dumps(out), flush=True)
try:
    comm.destroy()
except hpccl.HpcclError:
    pass
