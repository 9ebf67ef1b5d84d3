"""One process of a job that grows over a directory store (plain processes, as inflight_kill.py: no launcher
tears the survivors down when a rank dies). ROLE old: rank RANK of SIZE, STORE_DIR. MODE grow: the old ranks
grow by N_NEW at once. MODE kill: the VICTIM SIGKILLs itself in a loop of all_reduces; every survivor must
raise an HpcclError naming it, shrinks it away, then grows by N_NEW (a fresh process) back to size. ROLE new:
JOIN_RANK (0..N_NEW-1) joins the grow. Every process then runs and checks every call on the grown
communicator (tests/scripts/grow_checks.py); the old ranks also check that the communicator they grew from
still works. STORE_KIND torch: a torch FileStore in STORE_DIR instead. BUF numpy (default) or cupy (GPU
buffers on GPU DEVICE, default 0, on a stream of their own). Prints one line "RESULT {json}"."""
import json
import os
import signal
import time
import traceback

import numpy as np

import hpccl
from hpccl.bootstrap import StoreBootstrap
from dirstore import DirStore  # tests/scripts/dirstore.py
from grow_checks import buffers  # tests/scripts/grow_checks.py

store_dir = os.environ["STORE_DIR"]
if os.environ.get("STORE_KIND") == "torch":  # torch's FileStore (set, get, check as a c10d Store has them)
    import torch.distributed as dist
    store = dist.FileStore(os.path.join(store_dir, "torchstore"), -1)
else:
    store = DirStore(store_dir)
role, mode = os.environ["ROLE"], os.environ.get("MODE", "grow")
n_new = int(os.environ.get("N_NEW", "1"))
key = os.environ.get("KEY", "grow1")
result = {"role": role, "mode": mode, "t_start": time.time()}
checked, xp, kw = buffers()  # BUF numpy or cupy (tests/scripts/grow_checks.py)

if role == "new":
    result["join_rank"] = j = int(os.environ["JOIN_RANK"])
    t0 = time.monotonic()
    try:
        grown = hpccl.join(store=store, rank=j, key=key)
        result.update(rank=grown.rank, size=grown.size, join_s=round(time.monotonic() - t0, 3),
                      nodes=grown.num_nodes, path=grown._path)
        result["checked"] = checked(grown)
        grown.destroy()
    except Exception:  # noqa: BLE001 - reported: the test reads RESULT
        result["error"] = traceback.format_exc()[-1500:]
    print("RESULT " + json.dumps(result), flush=True)
    raise SystemExit(0)

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
victim = int(os.environ.get("VICTIM", "-1"))
result["rank0"] = r
comm = hpccl.Communicator(StoreBootstrap(store, r, n))
x = xp.ones(4096, np.float32)
try:
    base = comm
    if mode == "kill":
        for i in range(100000):
            if r == victim and i == int(os.environ.get("KILL_AT", "200")):
                with open(os.path.join(store_dir, "victim_at"), "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                comm.all_reduce(x, xp.empty_like(x), **kw)
                if kw:  # GPU: the call's failure is raised by its synchronize
                    kw["stream"].synchronize()
                    comm.synchronize()
            except hpccl.HpcclError as exc:
                result.update(error=type(exc).__name__, failed=getattr(exc, "rank", None),
                              missing=getattr(exc, "missing", None), at=time.time(), calls=i)
                break
        t0 = time.monotonic()
        base = comm.shrink([victim])
        result.update(shrunk_size=base.size, shrunk_rank=base.rank, shrink_s=round(time.monotonic() - t0, 3))
    else:
        comm.all_reduce(x, **kw)
    t0 = time.monotonic()
    grown = base.grow(n_new, key=key)
    result.update(rank=grown.rank, size=grown.size, grow_s=round(time.monotonic() - t0, 3), nodes=grown.num_nodes,
                  path=grown._path)
    t0 = time.monotonic()
    result["checked"] = checked(grown)
    result["old_checked"] = checked(base)  # the communicator grown from still works
    result["check_s"] = round(time.monotonic() - t0, 3)
    grown.destroy()
    if base is not comm:
        base.destroy()
except Exception:  # noqa: BLE001 - reported: the test reads RESULT
    result["error_after"] = traceback.format_exc()[-1500:]
comm.destroy()
print("RESULT " + json.dumps(result), flush=True)
