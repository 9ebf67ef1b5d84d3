"""Host time of the calling thread for a GPU call with a network step (issue 21's "< 20 us at any size"),
and the GPU time of the same calls, on a communicator spanning nodes (HPCCL_NODE_ID=split:1 on one GPU).

    mpirun -n 2 -x HPCCL_NODE_ID=split:1 python bench/net_step_cost.py [--json out.json]

Per size: the median wall time of the call itself (it enqueues and returns; the stream is synchronized
outside the timed region, so each call starts on a thread that waited for the GPU), of that the median time
inside the C replay of a recorded call, the network steps per call Python enqueued (0 when replayed), and over
a back-to-back loop (calls enqueued while the GPU works, as a training step's are) the host time per call, of
that the time inside the network front door's C call (its replay and bookkeeping, from its statistics), and
the event-timed GPU time per call."""
import argparse
import json
import statistics
import time

import cupy
import numpy as np

import hpccl
from hpccl.gpu.netreplay import NetReplays

ap = argparse.ArgumentParser()
ap.add_argument("--json")
ap.add_argument("--iters", type=int, default=30)
ap.add_argument("--nccl", action="store_true",
                help="also time NCCL's calls the same way (cupy.cuda.nccl; run under tests/scripts/nccl_hostid.sh "
                     "so NCCL takes its network transport)")
ap.add_argument("--sizes", default="8,1024,65536,1048576,16777216,67108864",
                help="message sizes in bytes, comma-separated")
a = ap.parse_args()
comm = hpccl.init()
s = cupy.cuda.Stream(non_blocking=True)
fired = []  # seconds inside each replay's C call (NetReplays.fire), to split the host time
_fire = NetReplays.fire  # patched on the class: a communicator makes its replays at its first GPU call


def _timed_fire(self, key, label):
    t = time.perf_counter()
    try:
        return _fire(self, key, label)
    finally:
        fired.append(time.perf_counter() - t)


NetReplays.fire = _timed_fire


def seen() -> tuple:
    """Network steps Python enqueued so far, and the fused and piped ones among them (the staged path's
    counters; the communicator's GPU side exists from its first GPU call)."""
    net = getattr(getattr(getattr(comm, "_dev", None), "prim", None), "net", None)
    return (net.steps, net.fused, net.piped) if net is not None else (0, 0, 0)


def expected() -> float:
    """The value of every element after 3 + 2 x iters sums of ones (float32: inf once it overflows, as on the GPU)."""
    with np.errstate(over="ignore"):
        return float(np.float32(comm.size) ** np.float32(3 + 2 * a.iters))


def warm(call) -> None:
    """Three calls, then the stream synchronized."""
    for _ in range(3):
        call()
    s.synchronize()


def after_sync(call) -> list:
    """Seconds of each of --iters calls, each made after the stream was synchronized."""
    host = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        call()
        host.append(time.perf_counter() - t0)
        s.synchronize()
    return host


def door_secs() -> tuple:
    """(calls, seconds) the network front door has replayed and spent so far (0, 0 without one)."""
    d = getattr(comm, "_door", None)
    rows = d.rows("cuda") if d is not None else []
    return sum(r[3] for r in rows), sum(r[5] for r in rows)


def wakes() -> int:
    """Times a caller woke a sleeping engine thread of this rank's lanes (a write(2) each), so far."""
    net = getattr(getattr(comm._dev, "prim", None), "net", None)
    return sum(e.wakes for e in getattr(net, "engs", []))  # the lanes' engines (_netengine.Engine)


def back_to_back(call) -> tuple:
    """(host us per call, GPU us per call, event-timed) over --iters calls enqueued back to back."""
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    e0.record(s)
    t0 = time.perf_counter()
    for _ in range(a.iters):
        call()
    b2b_us = (time.perf_counter() - t0) * 1e6 / a.iters
    e1.record(s)
    e1.synchronize()
    return b2b_us, cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / a.iters


def nccl_cost(x) -> dict:
    """NCCL's all_reduce on a copy of ``x`` timed as hpccl's is: each call after a stream sync, then back to
    back (the same sum, so the result is checked too)."""
    from hpccl.cli.nccl_baseline import nccl_comm, nccl_launch
    nc = nccl_comm()
    y = cupy.ones_like(x)
    call = lambda: nccl_launch(nc, "all_reduce", y.data.ptr, y.data.ptr, y.size, "float32", s.ptr)  # noqa: E731
    warm(call)
    host = after_sync(call)
    b2b_us, gpu_us = back_to_back(call)
    if float(y[0]) != expected():
        raise SystemExit(f"rank {comm.rank}: NCCL's all_reduce of {x.nbytes} bytes gave {float(y[0])}")
    return {"nccl_host_us_median": statistics.median(host) * 1e6, "nccl_host_us_max": max(host) * 1e6,
            "nccl_host_us_back_to_back": b2b_us, "nccl_gpu_us_per_call": gpu_us}


rows = []
for nbytes in [int(v) for v in a.sizes.split(",")]:
    n = max(1, nbytes // 4)
    x = cupy.ones(n, dtype=cupy.float32)
    call = lambda: comm.all_reduce(x, stream=s)  # noqa: E731
    warm(call)
    fired.clear()
    before = seen()
    host = after_sync(call)
    # network steps per call enqueued through Python (replayed calls add none), fused and piped among them
    per = [(y - x) / a.iters for x, y in zip(before, seen())]
    in_c = statistics.median(fired) * 1e6 if fired else 0.0
    d0, w0 = door_secs(), wakes()
    b2b_us, gpu_us = back_to_back(call)
    d1, w1 = door_secs(), wakes()
    door_us = (d1[1] - d0[1]) * 1e6 / (d1[0] - d0[0]) if d1[0] > d0[0] else 0.0
    comm.synchronize()
    ok = bool(float(x[0]) == expected())  # every call multiplied it by size
    row = {"bytes": nbytes, "host_us_median": statistics.median(host) * 1e6, "host_us_max": max(host) * 1e6,
           "host_us_back_to_back": b2b_us,
           "gpu_us_per_call": gpu_us, "ok": ok, "python_steps_per_call": per[0], "fused_per_call": per[1],
           "piped_per_call": per[2], "replay_c_us_median": in_c, "door_us_back_to_back": door_us,
           "wakes_per_call_back_to_back": (w1 - w0) / a.iters}
    if a.nccl:
        row.update(nccl_cost(x))
    rows.append(row)
    if comm.rank == 0 and a.nccl:
        print(f"{nbytes:>10} B  NCCL host {row['nccl_host_us_median']:8.1f} us (max {row['nccl_host_us_max']:8.1f}, "
              f"back to back {row['nccl_host_us_back_to_back']:6.1f})  gpu {row['nccl_gpu_us_per_call']:10.1f} us/call",
              flush=True)
    if comm.rank == 0:
        print(f"{nbytes:>10} B  host {row['host_us_median']:8.1f} us (max {row['host_us_max']:8.1f}, back to back {b2b_us:6.1f})  "
              f"gpu {gpu_us:10.1f} us/call  {'ok' if ok else 'WRONG'}  python steps/call {per[0]:.1f} "
              f"(fused {per[1]:.1f}, piped {per[2]:.1f})  in the C replay {in_c:.1f} us, in the door {door_us:.1f} us, "
              f"{(w1 - w0) / a.iters:.1f} engine wakes/call",
              flush=True)
if comm.rank == 0 and a.json:
    json.dump({"ranks": comm.size, "nodes": comm.num_nodes, "rows": rows,
               "path": comm._dev.path if comm._dev is not None else None}, open(a.json, "w"), indent=1)
comm.destroy()
