"""One rank of a job whose victim dies (SIGKILL) or stops (SIGSTOP) with calls IN FLIGHT, then the survivors
go on: each survivor must raise an HpcclError naming the victim (user numbering), keep a working GPU (a
kernel of its own runs, its buffers free), shrink the communicator to the survivors and run every collective
correctly on the new one. Plain processes over a directory store (RANK, SIZE, STORE_DIR), as die_peer.py.

Environment (all optional): VICTIM (rank), MODE kill|stop, KILL_AT (call index), SYNC_EVERY (calls between
stream synchronisations: up to that many in flight), COLL (all_reduce|all_gather|reduce_scatter|broadcast|
reduce|all_to_all), BYTES (per rank input), DTYPE, BUF cupy|numpy, PATH eager|graph (graph: the loop body
captured once in a CUDA graph and replayed), HPCCL_NODE_ID (layout). Prints one line "RESULT {json}"."""
import json
import os
import signal
import sys
import time
import traceback

import numpy as np

import hpccl
from hpccl.bootstrap import StoreBootstrap
from dirstore import DirStore, report_and_end_stopped  # tests/scripts/dirstore.py

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
store = os.environ["STORE_DIR"]
victim = int(os.environ.get("VICTIM", n - 1))
mode = os.environ.get("MODE", "kill")
kill_at = int(os.environ.get("KILL_AT", "300"))
every = int(os.environ.get("SYNC_EVERY", "50"))
coll = os.environ.get("COLL", "all_reduce")
nbytes = int(os.environ.get("BYTES", str(256 << 10)))
dtype = np.dtype(os.environ.get("DTYPE", "float32"))
gpu = os.environ.get("BUF", "cupy") == "cupy"
path = os.environ.get("PATH_KIND", "eager")
stop_file = os.environ.get("STOP_FILE")  # a bystander job (VICTIM=-1) runs until this file exists

if gpu:
    import cupy as xp
    from hpccl.kernels import Kernels
    xp.cuda.Device(0).use()
    Kernels.for_device(0).load((dtype.name, "float32", "int32", "float64"))
    stream = xp.cuda.Stream(non_blocking=True)
else:
    xp = np
    stream = None


def sync() -> None:
    if gpu:
        stream.synchronize()
        comm.synchronize()


class Loop:
    """The loop's buffers and one call of COLL on them; check() after a sync looks at the last result."""

    def __init__(self, c) -> None:
        self.c = c
        cnt = max(n, (nbytes // dtype.itemsize) // n * n)
        self.cnt = cnt
        self.x = xp.full(cnt, r + 1, dtype)
        self.out = None
        if coll == "all_gather":
            self.out = xp.empty(cnt * n, dtype)
        elif coll == "reduce_scatter":
            self.out = xp.empty(cnt // n, dtype)
        elif coll in ("all_reduce", "reduce", "all_to_all"):
            self.out = xp.empty(cnt, dtype)

    def call(self, i: int) -> None:
        c, x, o = self.c, self.x, self.out
        kw = {"stream": stream} if gpu else {}
        if coll == "all_reduce":
            c.all_reduce(x, o, **kw)
        elif coll == "all_gather":
            c.all_gather(x, o, **kw)
        elif coll == "reduce_scatter":
            c.reduce_scatter(x, o, **kw)
        elif coll == "broadcast":
            c.broadcast(x, root=0, **kw)
        elif coll == "reduce":
            c.reduce(x, o, root=0, **kw)
        elif coll == "all_to_all":
            c.all_to_all(x, o, **kw)

    def check(self) -> None:
        m = self.c.size
        if coll == "all_reduce":
            want = m * (m + 1) / 2
            got = float(self.out[-1])
        elif coll == "all_gather":
            want, got = m, float(self.out[-1])
        elif coll == "reduce_scatter":
            want, got = m * (m + 1) / 2, float(self.out[0])
        elif coll == "broadcast":
            want, got = 1.0, float(self.x[-1])
        elif coll == "reduce":
            if self.c.rank != 0:
                return
            want, got = m * (m + 1) / 2, float(self.out[0])
        else:
            want, got = m, float(self.out[-1])
        if coll not in ("broadcast",) and got != want:
            raise AssertionError(f"{coll}: {got} != {want}")
        if coll == "broadcast" and got != want and self.c.rank != 0:
            raise AssertionError(f"{coll}: {got} != {want}")


def every_collective(c) -> list:
    """Every collective once on fresh GPU (or host) buffers of the new communicator, each result checked."""
    m, me, done = c.size, c.rank, []
    kw = {"stream": stream} if gpu else {}
    for k in range(int(os.environ.get("AFTER_ROUNDS", "1"))):
        cnt = (1000 + 37 * k) * m
        x = xp.full(cnt, me + 1, np.float32)
        y = c.all_reduce(x, **kw); sync(); assert float(y[-1]) == m * (m + 1) / 2
        g = c.all_gather(xp.full(cnt // m, me, np.int32), **kw); sync(); assert int(g.ravel()[-1]) == m - 1
        p = c.reduce_scatter(xp.ones(cnt, np.float64), **kw); sync(); assert float(p[0]) == m
        b = xp.full(cnt, me, np.int64); c.broadcast(b, root=m - 1, **kw); sync(); assert int(b[0]) == m - 1
        z = xp.ones(cnt, np.float32); c.reduce(z, root=0, **kw); sync(); assert me != 0 or float(z[0]) == m
        a = c.all_to_all(xp.arange(cnt, dtype=np.int32) + me * cnt, **kw); sync()
        assert int(a[0]) == (cnt // m) * me, (int(a[0]), me)
        done.append(cnt)
    return ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]


comm = hpccl.Communicator(StoreBootstrap(DirStore(store), r, n))
pids = comm._boot.allgather(os.getpid())
ctx = stream if gpu else None
if ctx is not None:
    ctx.__enter__()
loop = Loop(comm)
loop.call(0)
sync()
loop.check()
graph = None
if gpu and path == "graph":  # the loop body captured once and replayed
    stream.begin_capture()
    loop.call(1)
    graph = stream.end_capture()
    graph.launch(stream)
    sync()
    loop.check()
open(os.path.join(store, f"ready{r}"), "w").close()
while not all(os.path.exists(os.path.join(store, f"ready{q}")) for q in range(n)):
    time.sleep(0.001)

result = {"rank": r, "victim": victim, "mode": mode}
i = 1
t_err = None
try:
    while i < kill_at + 100000:
        if r == victim and i == kill_at:
            with open(os.path.join(store, "victim_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
            result["resumed"] = True
        if graph is not None:
            graph.launch(stream)
        else:
            loop.call(i)
        i += 1
        if i % every == 0:
            sync()
            loop.check()
            if coll in ("broadcast", "reduce"):
                # a rank that only sends never waits on the others: a training loop meets them at its next
                # all_reduce, this loop at a barrier
                comm.barrier()
            if stop_file and os.path.exists(stop_file):
                break
    result["error"] = None
except hpccl.HpcclError as exc:
    t_err = time.time()
    result.update(error=type(exc).__name__, message=str(exc)[:600], code=exc.code,
                  failed=getattr(exc, "rank", None), missing=getattr(exc, "missing", None))
except Exception as exc:  # noqa: BLE001 - not an hpccl error (a lost CUDA context, a wrong result)
    t_err = time.time()
    result.update(error=type(exc).__name__, message=traceback.format_exc()[-1500:])
result.update(at=t_err or time.time(), calls=i)
if r == victim:
    result["is_victim"] = True

if r != victim and result.get("error"):
    named = result.get("failed") == victim or victim in (result.get("missing") or [])
    result["named"] = bool(named)
    try:  # the survivor's own GPU still works: a kernel runs, buffers free
        if gpu:
            k = xp.arange(1 << 20, dtype=np.float32)
            assert float((k * 2).sum()) == float((1 << 20) * ((1 << 20) - 1))
            xp.cuda.Device().synchronize()
            del k, loop
            xp.get_default_memory_pool().free_all_blocks()
        result["gpu_ok"] = True
    except Exception:  # noqa: BLE001
        result["gpu_ok"] = False
        result["gpu_error"] = traceback.format_exc()[-800:]
    try:  # shrink to the survivors and run every collective, checked
        t0 = time.monotonic()
        new = comm.shrink([victim])
        result["shrink_s"] = round(time.monotonic() - t0, 3)
        result["after_shrink"] = every_collective(new)
        new.destroy()
    except Exception:  # noqa: BLE001
        result["after_shrink"] = None
        result["shrink_error"] = traceback.format_exc()[-1500:]
print("RESULT " + json.dumps(result), flush=True)
report_and_end_stopped(store, r, n, victim, mode, pids[victim] if victim >= 0 else 0)
try:
    comm.destroy()
except Exception:  # noqa: BLE001
    pass
sys.exit(0)
