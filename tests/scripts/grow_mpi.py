"""One rank of an mpiexec job that grows through an MPI port (the old job) or joins through it (the new job,
a second mpiexec). ROLE old: rank 0 opens the port and writes its name to PORT_FILE; every old rank calls
grow(N_NEW, port=...); with STORE_DIR instead, it grows over that directory store (the new processes are
plain ones: tests/scripts/grow_ranks.py ROLE=new, KEY). ROLE new: waits for PORT_FILE, then
hpccl.join(port=...). Both check every call on the grown communicator (tests/scripts/grow_checks.py; BUF
numpy or cupy); the old ranks then check the communicator they grew from. An error is reported, not raised:
ALONE=1 (old) publishes no port, so no new process comes; a new job given a port nobody grows on waits
HPCCL_TIMEOUT. Prints one line "RESULT {json}" per rank."""
import json
import os
import time
import traceback

from mpi4py import MPI

import hpccl
from dirstore import DirStore  # tests/scripts/dirstore.py
from grow_checks import buffers  # tests/scripts/grow_checks.py

role, port_file = os.environ["ROLE"], os.environ.get("PORT_FILE", "")
store_dir = os.environ.get("STORE_DIR")
n_new = int(os.environ.get("N_NEW", "1"))
alone = os.environ.get("ALONE") == "1"
result = {"role": role, "world_rank": MPI.COMM_WORLD.rank}
if os.environ.get("BUF") == "cupy":  # one GPU per rank where there are several
    import cupy
    os.environ["DEVICE"] = str(MPI.COMM_WORLD.rank % cupy.cuda.runtime.getDeviceCount())
checked, _, _ = buffers()
t0 = time.monotonic()
if role == "old":
    comm = hpccl.init()
    port = None
    if comm.rank == 0 and store_dir is None:
        port = hpccl.open_port()
        if not alone:
            with open(port_file + ".tmp", "w") as f:
                f.write(port)
            os.replace(port_file + ".tmp", port_file)
    port = MPI.COMM_WORLD.bcast(port)
    try:
        if store_dir is None:
            grown = comm.grow(n_new, port=port)
        else:
            grown = comm.grow(n_new, store=DirStore(store_dir), key=os.environ.get("KEY", "grow1"))
        result.update(rank=grown.rank, size=grown.size, checked=checked(grown))
        grown.destroy()
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, argument=getattr(exc, "argument", None),
                      missing=getattr(exc, "missing", None), message=str(exc)[:600])
    except Exception:  # noqa: BLE001 - reported: the test reads RESULT
        result["error"] = traceback.format_exc()[-1500:]
    result["seconds"] = round(time.monotonic() - t0, 3)
    result["old_checked"] = checked(comm)  # the communicator grown from still works
    comm.destroy()
    if comm.rank == 0 and port is not None:
        hpccl.close_port(port)
else:
    while not os.path.exists(port_file):
        time.sleep(0.02)
    with open(port_file) as f:
        port = f.read()
    try:
        grown = hpccl.join(port=port)
        result.update(rank=grown.rank, size=grown.size, checked=checked(grown))
        grown.destroy()
    except hpccl.HpcclError as exc:
        result.update(error=type(exc).__name__, argument=getattr(exc, "argument", None), message=str(exc)[:600])
    result["seconds"] = round(time.monotonic() - t0, 3)
print("RESULT " + json.dumps(result), flush=True)
