"""A rank of a hierarchical layout (HPCCL_NODE_ID=split:2: nodes of 2 ranks) dies (SIGKILL) or stops
(SIGSTOP) inside a loop of collectives: every survivor must raise an HpcclError naming it in the user's
numbering (exc.rank for a death, exc.missing for a stop), within 3 s of a death, within HPCCL_TIMEOUT + 3 s
of a stop. Plain processes (RANK, SIZE, STORE_DIR) over a directory store, as in die_peer.py, so no launcher
tears the survivors down.

VICTIM: the rank that dies or stops (default: the last). MODE: kill (default) or stop. MIX: 1 runs a mix of
the hierarchical collectives (all_reduce, all_gather, reduce_scatter, broadcast, reduce), 0 all_reduce only.
BUF: numpy (default: host buffers) or cupy (GPU buffers, one GPU per rank by local rank, the loop's kernels
loaded before the communicator is made; the GPU machine's variant of the same test, not run in CI). Each rank
writes ready<r> after its first call; the victim kills or stops itself once every rank is ready and it has
made KILL_AFTER more calls. A stopped victim is resumed by the lowest survivor after it has reported, then
runs on alone until its peers' aborts reach it (or its own timeout) and exits."""
import json
import os
import signal
import sys
import time

import numpy as np

import hpccl
from hpccl.bootstrap import StoreBootstrap
from dirstore import DirStore  # tests/scripts/dirstore.py

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
store = os.environ["STORE_DIR"]
victim = int(os.environ.get("VICTIM", n - 1))
mode = os.environ.get("MODE", "kill")
mix = os.environ.get("MIX", "1") == "1"
after = int(os.environ.get("KILL_AFTER", "5"))
gpu = os.environ.get("BUF", "numpy") == "cupy"
if gpu:
    import cupy as xp
    from hpccl.kernels import Kernels
    dev = r % 2 % max(1, xp.cuda.runtime.getDeviceCount())
    xp.cuda.Device(dev).use()
    # the CUDA context and the loop's kernels made before the first call: a cold start (a fresh MPS server,
    # NVRTC with an empty cache) takes seconds, more than the stop case's HPCCL_TIMEOUT of 2 s between ranks
    Kernels.for_device(dev).load(("float32", "float64", "int32", "int64"))
else:
    xp = np

comm = hpccl.Communicator(StoreBootstrap(DirStore(store), r, n))
pids = comm._boot.allgather(os.getpid())


def sync() -> None:
    if gpu:  # a GPU call's failure is raised by the next call or by synchronize(), which waits for the GPU
        comm.synchronize()


def call(i: int) -> None:
    """Call i of the loop, the same on every rank; results checked."""
    count = 4096 * n + (i % 3) * 2 * n  # every collective's count divides evenly, and varies
    k = i % 5 if mix else 0
    if k == 0:
        x = xp.full(count, r + 1, xp.float32)
        comm.all_reduce(x)
        sync()
        assert float(x[-1]) == n * (n + 1) / 2, float(x[-1])
    elif k == 1:
        g = comm.all_gather(xp.full(count // n, r, xp.int32))
        sync()
        assert int(g.ravel()[-1]) == n - 1
    elif k == 2:
        part = comm.reduce_scatter(xp.ones(count, xp.float64))
        sync()
        assert float(part[0]) == n
    elif k == 3:
        b = xp.full(count, r, xp.int64)
        comm.broadcast(b, root=i % n)
        sync()
        assert int(b[0]) == i % n
    else:
        x = xp.full(count, 1, xp.float32)
        comm.reduce(x, root=i % n)
        sync()
        assert r != i % n or float(x[0]) == n


call(0)
open(os.path.join(store, f"ready{r}"), "w").close()
while not all(os.path.exists(os.path.join(store, f"ready{q}")) for q in range(n)):
    time.sleep(0.001)
result, done = {"rank": r}, 1
try:
    while True:
        if r == victim and done == after:
            with open(os.path.join(store, "victim_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
            if mode == "stop":  # resumed by a survivor after they reported
                result["resumed"] = True
        call(done)
        done += 1
        if done > 100000:
            break
except hpccl.HpcclError as exc:
    result.update(error=type(exc).__name__, message=str(exc), code=exc.code, failed=getattr(exc, "rank", None),
                  missing=getattr(exc, "missing", None))
except Exception as exc:  # noqa: BLE001 - not an hpccl error: the test fails on it
    import traceback
    result.update(error=type(exc).__name__, message=traceback.format_exc()[-3000:])
result.update(at=time.time(), done=done)
if r == victim:
    result["victim"] = True
print("RESULT " + json.dumps(result), flush=True)
if mode == "stop" and r == min(q for q in range(n) if q != victim):
    # every survivor has reported (its ack file) before the stopped rank goes on
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(store, f"reported{q}")) for q in range(n) if q not in (victim, r)):
        time.sleep(0.01)
    os.kill(pids[victim], signal.SIGCONT)
open(os.path.join(store, f"reported{r}"), "w").close()
comm.destroy()
sys.exit(0)
