"""Repeated hier all_reduce on GPU buffers replayed through its chain (hpccl/gpu/hierreplay.py), on the GPU
machine: run under mpirun with HPCCL_NODE_ID=split:K (several nodes of K > 1 ranks); HPCCL_HIER_REPLAY=1 (the default)
(0: the same checks with no chain; every call must then run in Python). Checked per rank: values
of repeated calls in place and out of place, two buffers in turn, max, on another stream, and the calls the
chain does not carry (an uneven size, avg) right too; the repeated calls were replayed by the chain; every
rank's sequence numbers (the user's communicator and the network sub-communicator) agree at the end. With
HIER_MIX=1 rank 0 runs with HPCCL_HIER_REPLAY=0 (the Python path every call) beside replaying peers.
Prints 'RESULT {json}' per rank."""
from __future__ import annotations

import json
import os

if os.environ.get("HIER_MIX") == "1" and os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
    os.environ["HPCCL_HIER_REPLAY"] = "0"

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import hpccl  # noqa: E402

comm = hpccl.init()
rank, n, L = comm.rank, comm.size, comm.local_size
bad: list = []
checks = 0


def check(what: str, ok: bool) -> None:
    global checks
    checks += 1
    if not ok:
        bad.append(what)


def total(i: int) -> float:
    return float(n * i + n * (n - 1) // 2)


check("layout: several nodes of several ranks", comm.num_nodes > 1 and L > 1)
count = 1 << 16  # 256 KiB of float32, a multiple of any local size up to 16
x, y, z = (cupy.empty(count, dtype=cupy.float32) for _ in range(3))


def repeat(what: str, calls: int, step) -> None:
    """``calls`` rounds of step(i), which fills, calls and returns whether round i's values are right."""
    ok = True
    for i in range(calls):
        ok = step(i) and ok
    check(what, ok)


def in_place(i: int, b=x, op=hpccl.SUM, want=total) -> bool:
    b.fill(rank + i)
    comm.all_reduce(b, op=op)
    return bool(cupy.allclose(b, want(i)) if op == hpccl.AVG else (b == want(i)).all())


def out_of_place(i: int) -> bool:
    x.fill(rank + i)
    comm.all_reduce(x, y)
    return bool((y == total(i)).all()) and bool((x == rank + i).all())


def turns(i: int) -> bool:
    b = x if i % 2 else z
    b.fill(rank * i)
    comm.all_reduce(b)
    return bool((b == float(i * n * (n - 1) // 2)).all())


def other_stream(i: int, s=cupy.cuda.Stream(non_blocking=True)) -> bool:
    with s:
        x.fill(rank + i)
        comm.all_reduce(x, stream=s)
        ok = bool((x == total(i)).all())
    s.synchronize()
    return ok


repeat("in place, 20 calls on one buffer", 20, in_place)
repeat("out of place, 20 calls (input untouched)", 20, out_of_place)
repeat("two buffers in turn", 20, turns)
repeat("max", 10, lambda i: in_place(i, op=hpccl.MAX, want=lambda i: float(n - 1 + i)))
repeat("on another stream", 10, other_stream)
hier = comm._dev.hier
fired = hier.fired if hier is not None else 0
on = bool(hpccl.config.get("HPCCL_HIER_REPLAY"))
check(f"repeated calls replayed by the chain ({fired})", fired >= 70 if on else fired == 0)
u = cupy.empty(count + 1, dtype=cupy.float32)  # not a multiple of the local size: hier's uneven path
repeat("uneven size (no chain)", 5, lambda i: in_place(i, b=u))
repeat("avg (no chain)", 5, lambda i: in_place(i, op=hpccl.AVG, want=lambda i: total(i) / n))
check("the calls the chain does not carry were not replayed", (hier.fired if hier is not None else 0) == fired)
cupy.cuda.get_current_stream().synchronize()
# the user's communicator and the network's count every call, replayed or not (a node engine's replay counts
# on the engine's own counter instead)
seqs = np.array([comm._seq, comm._sub["inter"]._seq], dtype=np.int64)
every = comm.all_gather(seqs).reshape(n, 2)
check("sequence numbers agree on every rank", bool((every == every[0]).all()))
print("RESULT " + json.dumps({"rank": rank, "checks": checks, "bad": bad, "fired": fired,
                              "replay": on, "seqs": seqs.tolist()}), flush=True)
comm.destroy()
