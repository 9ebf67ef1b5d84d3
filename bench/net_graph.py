"""GPU all_reduce across nodes, eager and replayed from a CUDA graph, hpccl beside NCCL in one job (issue 33's
"graph replay" column): 2 ranks as 2 nodes on one GPU, or hier's layouts (split:2 with 4 ranks).

    mpirun -n 2 -x HPCCL_NODE_ID=split:1 tests/scripts/nccl_hostid.sh python bench/net_graph.py [--json out]

Per size: time per call of back-to-back calls (CUDA events, the maximum over ranks, after warm-up), and of
the same calls captured 20 to a graph and the graph replayed; NCCL the same way on the same stream. Every
hpccl result (eager and replayed) is checked against the exact sum."""
from __future__ import annotations

import argparse
import json

import cupy
from mpi4py import MPI

import hpccl
from hpccl.cli.nccl_baseline import nccl_comm, nccl_launch
from hpccl.ops import SUM

PER_GRAPH = 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--sizes", default="8,1024,8192,65536,1048576")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-nccl", action="store_true")
    a = ap.parse_args()
    mc = MPI.COMM_WORLD
    comm = hpccl.init()
    n, rank = comm.size, comm.rank
    nc = None if a.no_nccl else nccl_comm(mc)
    s = cupy.cuda.Stream(non_blocking=True)

    def timed(fn, iters: int) -> float:
        for _ in range(3):
            fn()
        s.synchronize()
        mc.Barrier()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(s)
        for _ in range(iters):
            fn()
        e1.record(s)
        e1.synchronize()
        return mc.allreduce(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / iters, op=MPI.MAX)

    def graph(fn):
        s.synchronize()
        comm.barrier(stream=s)
        s.synchronize()
        with s:
            s.begin_capture()
            for _ in range(PER_GRAPH):
                fn()
            return s.end_capture()

    rows = []
    for nbytes in [int(x) for x in a.sizes.split(",")]:
        count = max(1, nbytes // 4)
        x = cupy.full(count, rank + 1, dtype=cupy.float32)
        y = cupy.zeros(count, dtype=cupy.float32)
        f = lambda: comm.all_reduce(x, y, SUM, stream=s)  # noqa: E731
        want = n * (n + 1) / 2
        eager = timed(f, a.iters)
        ok = float(y.min()) == float(y.max()) == want
        y.fill(0)
        g = graph(f)
        replayed = timed(lambda: g.launch(s), max(3, a.iters // PER_GRAPH)) / PER_GRAPH
        s.synchronize()
        ok = ok and float(y.min()) == float(y.max()) == want
        ok = bool(mc.allreduce(int(ok), op=MPI.MIN))
        row = {"bytes": nbytes, "hpccl_us": eager, "hpccl_graph_us": replayed, "ok": ok}
        if nc is not None:
            h = lambda: nccl_launch(nc, "all_reduce", x.data.ptr, y.data.ptr, count, "float32", s.ptr)  # noqa: E731
            row["nccl_us"] = timed(h, a.iters)
            gn = graph(h)
            row["nccl_graph_us"] = timed(lambda: gn.launch(s), max(3, a.iters // PER_GRAPH)) / PER_GRAPH
            del gn
        rows.append(row)
        if rank == 0:
            r = (f"  eager {row['hpccl_us'] / row['nccl_us']:5.2f}x  graph {replayed / row['nccl_graph_us']:5.2f}x"
                 if nc is not None else "")
            nccl = (f"  nccl {row['nccl_us']:8.1f} us  nccl graph {row['nccl_graph_us']:8.1f} us"
                    if nc is not None else "")
            print(f"{nbytes:>9} B  hpccl {eager:8.1f} us  graph {replayed:8.1f} us{nccl}{r}  "
                  f"{'ok' if ok else 'WRONG'}", flush=True)
        del g
    if rank == 0 and a.json:
        json.dump({"ranks": n, "nodes": comm.num_nodes, "path": comm._dev.path, "rows": rows},
                  open(a.json, "w"), indent=1)
    comm.synchronize()
    comm.destroy()


if __name__ == "__main__":
    main()
