"""Where a GPU network step on the eager path stops when rank 0's engines are held (fault injection,
Engine.hold): the open question of docs/perf/issue33/backstop/eager_hang/ (on the GPU such a stream stayed
blocked after the engines were let go; on the CPU stand-in it drains). 2 ranks as 2 nodes on one GPU:

    mpirun -n 2 -x HPCCL_NODE_ID=split:1 python3 bench/eager_hold_probe.py [--hold 8] [--timeout 2] [--mib 4]

Each rank warms up with the default HPCCL_TIMEOUT (the first GPU call's set-up outlasts a short one), then
makes a communicator with --timeout and HPCCL_NET_PIPE=0, holds rank 0's engines for --hold seconds, and
enqueues one all_reduce of --mib MiB between two events on its stream. A thread prints every 0.5 s, per rank:
whether each event has passed (cudaEventQuery, never blocking), the ready word and tokens handed out, each
lane's done word against the last value handed out, the stuck word, the engines' loop rounds, errors and
failed steps whose sends UCX still holds (lingering).
The main thread never blocks on the GPU: it says when the stream passed the call, and after --wait seconds
(every rank stays that long: one that left would close its endpoints and end its peer's sends) it prints the
last state and exits."""
from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--hold", type=float, default=8.0)
ap.add_argument("--timeout", type=float, default=2.0)
ap.add_argument("--mib", type=int, default=4)
ap.add_argument("--wait", type=float, default=30.0)
a = ap.parse_args()

import cupy  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hpccl  # noqa: E402

world = MPI.COMM_WORLD
warm = hpccl.Communicator(world.Dup())
world.Barrier()
warm.all_reduce(cupy.ones(16, dtype=cupy.float32))
warm.synchronize()
warm.destroy()
os.environ["HPCCL_TIMEOUT"], os.environ["HPCCL_NET_PIPE"] = str(a.timeout), "0"
comm = hpccl.Communicator(world.Dup())
world.Barrier()
comm.all_reduce(cupy.ones(16, dtype=cupy.float32))
comm.synchronize()
net = comm._dev.prim.net
word = lambda addr: ctypes.c_uint32.from_address(addr).value  # noqa: E731
s = cupy.cuda.Stream(non_blocking=True)
x = cupy.ones(a.mib << 18, dtype=cupy.float32)
e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
t0 = time.monotonic()


def state(tag: str) -> str:
    return (f"[rank {comm.rank} {time.monotonic() - t0:5.1f}s {tag}] before {e0.done} after {e1.done} "
            f"ready {word(net.ready_h)} tok {net.st.tok} done {[word(h) for h, _d in net.dones]} "
            f"val {list(net.st.val)[:len(net.engs)]} stuck {word(net.stuck_h)} steps {net.steps} "
            f"rounds {[e.beats if hasattr(e, 'beats') else '?' for e in net.engs]} "
            f"errors {[bool(e.error()) for e in net.engs]} "
            f"lingering {[getattr(e, 'lingering', '?') for e in net.engs]}")


def watch() -> None:
    while True:
        time.sleep(0.5)
        print(state("watch"), flush=True)


threading.Thread(target=watch, daemon=True).start()
if comm.rank == 0:
    for e in net.engs:
        e.hold(a.hold)
world.Barrier()
t0 = time.monotonic()
with s:
    e0.record(s)
    try:
        comm.all_reduce(x, stream=s)
        print(state("enqueued"), flush=True)
    except Exception as exc:  # noqa: BLE001 - a probe reports whatever happens
        print(f"[rank {comm.rank}] the call raised: {exc}"[:300], flush=True)
    e1.record(s)
end = time.monotonic() + a.wait
passed = False
while time.monotonic() < end:  # every rank stays the whole time: a rank that left would close its endpoints
    if e1.done and not passed:
        passed = True
        print(state("passed"), flush=True)
    time.sleep(0.1)
print(state("end"), flush=True)
os._exit(0)  # no destroy: a blocked stream would hold it
