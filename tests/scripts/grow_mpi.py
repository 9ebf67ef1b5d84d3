"""One rank of an mpiexec job that grows through an MPI port (the old job) or joins through it (the new job,
a second mpiexec). ROLE old: rank 0 opens the port and writes its name to PORT_FILE; every old rank calls
grow(N_NEW, port=...). ROLE new: waits for PORT_FILE, then hpccl.join(port=...). Both check every call on
the grown communicator (tests/scripts/grow_checks.py); the old ranks then check the communicator they grew
from. An error is reported, not raised: ALONE=1 (old) publishes no port, so no new process comes; a new job
given a port nobody grows on waits HPCCL_TIMEOUT. Prints one line "RESULT {json}" per rank."""
import json
import os
import time
import traceback

from mpi4py import MPI

import hpccl
from grow_checks import every_call  # tests/scripts/grow_checks.py

role, port_file = os.environ["ROLE"], os.environ["PORT_FILE"]
n_new = int(os.environ.get("N_NEW", "1"))
alone = os.environ.get("ALONE") == "1"
result = {"role": role, "world_rank": MPI.COMM_WORLD.rank}
t0 = time.monotonic()
if role == "old":
    comm = hpccl.init()
    port = None
    if comm.rank == 0:
        port = hpccl.open_port()
        if not alone:
            with open(port_file + ".tmp", "w") as f:
                f.write(port)
            os.replace(port_file + ".tmp", port_file)
    port = MPI.COMM_WORLD.bcast(port)
    try:
        grown = comm.grow(n_new, port=port)
        result.update(rank=grown.rank, size=grown.size, checked=every_call(grown))
        grown.destroy()
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, argument=getattr(exc, "argument", None),
                      missing=getattr(exc, "missing", None), message=str(exc)[:600])
    except Exception:  # noqa: BLE001 - reported: the test reads RESULT
        result["error"] = traceback.format_exc()[-1500:]
    result["seconds"] = round(time.monotonic() - t0, 3)
    result["old_checked"] = every_call(comm)  # the communicator grown from still works
    comm.destroy()
    if comm.rank == 0:
        hpccl.close_port(port)
else:
    while not os.path.exists(port_file):
        time.sleep(0.02)
    with open(port_file) as f:
        port = f.read()
    try:
        grown = hpccl.join(port=port)
        result.update(rank=grown.rank, size=grown.size, checked=every_call(grown))
        grown.destroy()
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, argument=getattr(exc, "argument", None), message=str(exc)[:600])
    result["seconds"] = round(time.monotonic() - t0, 3)
print("RESULT " + json.dumps(result), flush=True)
