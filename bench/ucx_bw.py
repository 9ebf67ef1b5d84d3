"""Raw ucxx tag send/recv against hpccl's UcxTransport (and a Communicator send/recv) in ONE run, 2 ranks.

    mpiexec -n 2 python bench/ucx_bw.py [-b 1K] [-e 64M] [-f 4] [--json out.json]

Both ranks exchange a message of each size at once (a bidirectional sendrecv, as a ring step does): each
path posts one receive and one send and polls until both complete. Per size and per path, the median over
``iters`` timed exchanges (after warm-up) gives the per-direction bandwidth nbytes / t. The three paths run
interleaved, one size at a time, so machine noise hits them alike:

    raw    ucxx low-level API directly: its own UCXContext/UCXWorker, endpoint from the worker address,
           ep.tag_send / ep.tag_recv, worker.progress() polling (what hpccl is built on)
    hpccl  hpccl.transport.ucx.UcxTransport.isend / irecv, Request.test() polling
    comm   hpccl.Communicator (HPCCL_NODE_ID=split:1, so the peer is "another node") group send+recv,
           i.e. with primitives and the waiter (spin, then yield/sleep) on top

The raw path uses the same UCX_TLS / error-handling choice as the transport, so only hpccl's own cost
differs. Run across emulated hosts (tests/scripts/netns_hosts.sh + netns_exec.sh, UCX_TLS=tcp,self) or on
one host (UCX picks shared memory)."""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

os.environ.setdefault("HPCCL_NODE_ID", "split:1")
import hpccl  # noqa: E402
from hpccl.bootstrap import MpiBootstrap  # noqa: E402
from hpccl.config import _size  # noqa: E402
from hpccl.transport.ucx import UcxTransport, _api, _Array  # noqa: E402


def _raw(world, tls: str, eh: bool):
    cfg = {"TLS": tls} if tls != "all" and os.environ.get("UCX_TLS") != tls else {}
    ctx = _api.UCXContext(cfg, feature_flags=(_api.Feature.TAG,))
    worker = _api.UCXWorker(ctx)
    addrs = world.allgather(bytes(worker.address))
    peer = 1 - world.rank
    ep = _api.UCXEndpoint.create_from_worker_address(
        worker, _api.UCXAddress.create_from_buffer(addrs[peer]), eh)
    seq = [0]

    def exchange(send: np.ndarray, recv: np.ndarray) -> None:
        s = seq[0]
        seq[0] += 1
        reqs = [ep.tag_recv(_Array(recv), _api.UCXXTag(s), _api.UCXXTagMaskFull),
                ep.tag_send(_Array(send), _api.UCXXTag(s))]
        while not (reqs[0].completed and reqs[1].completed):
            worker.progress()
        reqs[0].check_error()
        reqs[1].check_error()
    return exchange, (ctx, worker, ep)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", default="1K")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("--json", default="")
    p.add_argument("--mem", default="host", choices=["host", "cuda"],
                   help="buffer memory: numpy, or CuPy on GPU (rank %% GPUs); cuda skips the comm path")
    a = p.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 2:
        sys.exit("run with exactly 2 ranks")
    r, peer = world.rank, 1 - world.rank
    xp = np
    if a.mem == "cuda":
        import cupy
        cupy.cuda.Device(r % cupy.cuda.runtime.getDeviceCount()).use()
        cupy.zeros(1)  # a current CUDA context before UCX starts
        xp = cupy

    transport = UcxTransport(MpiBootstrap(world), r)
    raw, keep = _raw(world, transport.tls, transport.error_handling)

    def via_transport(send: np.ndarray, recv: np.ndarray) -> None:
        reqs = [transport.irecv(peer, recv, None), transport.isend(peer, send)]
        while reqs:
            reqs = [q for q in reqs if not q.test()]

    comm = hpccl.init(world)

    def via_comm(send: np.ndarray, recv: np.ndarray) -> None:
        with comm.group():
            comm.send(send, peer)
            comm.recv(recv, peer)

    paths = {"raw": raw, "hpccl": via_transport, "comm": via_comm}
    if a.mem == "cuda":
        del paths["comm"]  # device buffers in a Communicator take the CUDA path, not this transport
    rows = []
    n = _size(a.b)
    while n <= _size(a.e):
        send = xp.full(n, r + 1, dtype=np.uint8)
        recv = xp.zeros(n, dtype=np.uint8)
        iters = max(5, min(200, int(256e6 / n)))
        times = {k: [] for k in paths}
        sync = xp.cuda.runtime.deviceSynchronize if xp is not np else (lambda: None)
        for fn in paths.values():  # warm-up (endpoints, registration caches)
            fn(send, recv)
        sync()
        for _ in range(iters):
            for name, fn in paths.items():
                world.Barrier()
                t0 = time.perf_counter()
                fn(send, recv)
                times[name].append(time.perf_counter() - t0)
        assert int(recv[0]) == peer + 1 and int(recv[-1]) == peer + 1
        med = {k: world.allreduce(statistics.median(v), op=MPI.MAX) for k, v in times.items()}
        med.setdefault("comm", math.nan)
        row = {"bytes": n, "iters": iters, **{f"{k}_us": med[k] * 1e6 for k in med},
               **{f"{k}_GBps": n / med[k] / 1e9 for k in med},
               "hpccl_vs_raw": med["raw"] / med["hpccl"], "comm_vs_raw": med["raw"] / med["comm"]}
        rows.append(row)
        n *= a.f
    if r == 0:
        print(f"# ucx_bw: 2 ranks, {a.mem} memory, UCX_TLS={transport.tls}, error handling "
              f"{'on' if transport.error_handling else 'off'}, bidirectional exchange, median per size")
        print(f"{'bytes':>10} {'raw GB/s':>9} {'hpccl GB/s':>10} {'comm GB/s':>9} {'hpccl/raw':>9} "
              f"{'comm/raw':>8} {'raw us':>9} {'hpccl us':>9}")
        for x in rows:
            print(f"{x['bytes']:>10} {x['raw_GBps']:>9.3f} {x['hpccl_GBps']:>10.3f} {x['comm_GBps']:>9.3f} "
                  f"{x['hpccl_vs_raw']:>9.2f} {x['comm_vs_raw']:>8.2f} {x['raw_us']:>9.1f} {x['hpccl_us']:>9.1f}")
        big = [x for x in rows if x["bytes"] >= 1 << 20]
        if big:
            print(f"# >= 1 MiB: hpccl/raw min {min(x['hpccl_vs_raw'] for x in big):.2f}, "
                  f"geomean {statistics.geometric_mean([x['hpccl_vs_raw'] for x in big]):.2f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"mem": a.mem, "tls": transport.tls, "error_handling": transport.error_handling, "rows": rows}, f,
                          indent=1)
    comm.destroy()
    transport.close()
    del keep


if __name__ == "__main__":
    main()
