"""One job of the shared-GPU runs (issue 32; bench/gpu_coexist.sh starts several at once on one GPU): a loop
of random GPU collectives (all_reduce, all_gather, broadcast, reduce_scatter; 1 to --max-elems float32
elements, log-uniform), every array made on the calls' stream and every result checked on the device.
Each rank prints one line: JOB {"rank", "calls", "wrong", "error", "seconds", "sync"}; exit 1 on any wrong
result or error."""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def summarize(paths: list) -> int:
    """One line over the JOB reports in the given logs (bench/gpu_coexist.sh)."""
    import re
    rows = []
    for p in paths:  # ranks' lines can run into each other in a shared log: find each report on its own
        with open(p, errors="replace") as f:
            rows += [json.loads(m.group(1)) for m in re.finditer(r"JOB (\{[^{}]*\})", f.read())]
    errs = [r["error"] for r in rows if r["error"]]
    print(f"{len(rows)} rank reports, calls {sum(r['calls'] for r in rows)}, wrong {sum(r['wrong'] for r in rows)}, "
          f"errors {len(errs)}, sync {sorted(set(r['sync'] for r in rows))}"
          + (f"; first error: {errs[0]}" if errs else ""))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--summarize"]:
        return summarize(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-elems", type=int, default=1 << 20)
    a = ap.parse_args()
    import cupy as cp

    import hpccl
    from hpccl.gpu.device import rank_device
    comm = hpccl.init()
    cp.cuda.Device(rank_device(comm.local_rank, cp.cuda.runtime.getDeviceCount())).use()
    n, me = comm.size, comm.rank
    rng = np.random.default_rng(a.seed)  # the same draws on every rank of the job
    stream = cp.cuda.Stream(non_blocking=True)
    wrong, error, done = 0, None, 0
    tri = n * (n - 1) / 2
    t0 = time.time()
    with stream:
        for i in range(a.calls):
            coll = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")[int(rng.integers(4))]
            count = int(np.exp(rng.uniform(0, np.log(a.max_elems))))
            try:
                if coll == "reduce_scatter":
                    base = cp.arange(count * n, dtype=cp.float32) % 97
                    y = comm.reduce_scatter(base + me, stream=stream)
                    want = (base * n + tri)[me * count:(me + 1) * count]
                else:
                    base = cp.arange(count, dtype=cp.float32) % 97
                    x = base + me
                    if coll == "all_reduce":
                        y, want = comm.all_reduce(x, stream=stream), base * n + tri
                    elif coll == "all_gather":
                        y = comm.all_gather(x, stream=stream)
                        want = cp.concatenate([base + r for r in range(n)])
                    else:
                        root = i % n
                        comm.broadcast(x, root, stream=stream)
                        y, want = x, base + root
                ok = bool(cp.array_equal(y.reshape(-1), want))  # waits for the stream
            except hpccl.HpcclError as exc:
                error = f"call {i} ({coll}, {count} elements): {type(exc).__name__}: {exc}"
                break
            wrong += not ok
            done += 1
    try:
        comm.synchronize()
    except hpccl.HpcclError as exc:
        error = error or f"synchronize: {type(exc).__name__}: {exc}"
    secs = time.time() - t0
    eng = comm._dev.engine if comm._dev is not None else None
    sync = ("stream" if eng.safe else "spin") if eng is not None else "-"
    print("JOB " + json.dumps({"rank": me, "size": n, "calls": done, "wrong": wrong, "error": error,
                               "seconds": round(secs, 3), "sync": sync}), flush=True)
    comm.destroy()
    return 1 if (wrong or error) else 0


if __name__ == "__main__":
    sys.exit(main())
