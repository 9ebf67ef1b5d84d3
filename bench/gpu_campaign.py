"""GPU correctness campaign: random collectives on device buffers, every output checked against numpy on
the host. Run under MPI on the GPU machine, e.g. (bench/gpu_suite.sh stage 'campaign'):

    mpirun -n 4 python3 bench/gpu_campaign.py --cases 1000 --json out.json

Every rank draws the same cases from one seed (no exchange needed): collective, dtype, op, root, size
(1 element to --max-bytes per buffer, log-uniform, odd counts included), algorithm (forced from the ones the
tuner offers on this layout, or chosen), in or out of place, registered (zero-copy / copy-engine) or staged
buffers, and an element offset that makes pointers unaligned. Inputs are slices of one random pool per dtype
at per-rank offsets, so every rank can build every peer's input and the reference costs one numpy reduction.
Pool values make sums and products exact in every dtype, so a wrong element is a wrong element, not
rounding. Outputs are poisoned before each call; a non-root's untouched output is checked too. Exit code 1
when any case is wrong or raised."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))

from hpccl.ops import AVG, MAX, MIN, PROD, SUM, bfloat16  # noqa: E402

from gpu_util import reference  # noqa: E402  (the reduction in rank order, as the kernels define it)

DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
COLLS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
OPS = (SUM, PROD, MIN, MAX, AVG)
POISON = 0xA5
CORRUPT = [0]
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}


def np_dt(name: str) -> Any:
    return bfloat16 if name == "bfloat16" else np.dtype(name)


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale != 1 else t) * scale)


class Pools:
    """One random host pool per (dtype, kind) and its device copy; kind 'prod' holds values whose products
    over 8 ranks are exact, 'gen' values whose sums are."""

    def __init__(self, elems_bytes: int, seed: int, gpu: bool) -> None:
        self.bytes, self.seed, self.gpu = elems_bytes, seed, gpu
        self.host: Dict[Tuple[str, str], np.ndarray] = {}
        self.dev: Dict[Tuple[str, str], Any] = {}

    def get(self, name: str, kind: str) -> Tuple[np.ndarray, Any]:
        key = (name, kind)
        if key not in self.host:
            dt = np_dt(name)
            n = self.bytes // dt.itemsize
            rng = np.random.default_rng([self.seed, DTYPES.index(name), kind == "prod"])
            if name in FLOATS:
                if kind == "prod":
                    x = rng.choice(np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]), n)
                else:
                    x = rng.integers(-32, 33, n) / 4.0  # quarters in [-8, 8]: sums of 8 exact in bfloat16
            elif kind == "prod":
                x = rng.integers(1, 4, n) * (rng.choice(np.array([-1, 1]), n) if dt.kind == "i" else 1)
            else:
                x = rng.integers(-50, 51, n) if dt.kind == "i" else rng.integers(0, 101, n)
            h = x.astype(dt)
            self.host[key] = h
            if self.gpu:
                import cupy
                self.dev[key] = cupy.asarray(h.view(np.uint16) if name == "bfloat16" else h)
                # made on CuPy's current stream (a pageable copy may still be in flight): the cases copy
                # from it on another stream
                cupy.cuda.runtime.deviceSynchronize()
            else:
                self.dev[key] = h
        return self.host[key], self.dev[key]


def mismatch(name: str, got: np.ndarray, want: np.ndarray) -> Optional[str]:
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if name in FLOATS:
        g, w = got.astype(np.float64), want.astype(np.float64)
        bad = ~(np.abs(g - w) <= TOL[name] * np.maximum(1.0, np.abs(w)))
    else:
        bad = got != want
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return f"{int(bad.sum())} of {bad.size} wrong, first at {i}: got {got[i]!r} want {want[i]!r}"


class Arena:
    """A device allocation of its own (cudaMalloc, not CuPy's pool), so registering it covers exactly it;
    host memory with --mem host (a dry run of the campaign's own logic on a machine without a GPU)."""

    def __init__(self, nbytes: int, gpu: bool) -> None:
        self.nbytes, self.gpu = nbytes, gpu
        if gpu:
            import cupy
            self.mem = cupy.cuda.Memory(nbytes)
            self.whole = cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(self.mem, 0))
        else:
            self.whole = np.zeros(nbytes, np.uint8)

    def view(self, name: str, count: int, off_elems: int) -> Any:
        dt = np.dtype(np.uint16) if name == "bfloat16" and self.gpu else np_dt(name)
        start = off_elems * dt.itemsize
        assert start + count * dt.itemsize <= self.nbytes
        if not self.gpu:
            return self.whole[start:start + count * dt.itemsize].view(dt)
        import cupy
        return cupy.ndarray((count,), dt, cupy.cuda.MemoryPointer(self.mem, start))


class HostStream:
    """Stands in for a CUDA stream in the host dry run."""

    def __enter__(self) -> "HostStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


def as_bf16(x: Any) -> Any:
    """A uint16 CuPy view of bfloat16 data as a torch bfloat16 tensor (CuPy has no bfloat16)."""
    import torch
    return torch.as_tensor(x, device="cuda").view(torch.bfloat16)


def draw(i: int, args: Any, n: int, algos: Dict[str, List[str]]) -> Dict[str, Any]:
    """Case i, the same on every rank."""
    rng = np.random.default_rng([args.seed, i])
    coll = COLLS[int(rng.integers(len(COLLS)))]
    name = DTYPES[int(rng.integers(len(DTYPES)))]
    item = np_dt(name).itemsize
    ops = [o for o in OPS if o is not AVG or name in FLOATS]
    op = ops[int(rng.integers(len(ops)))] if coll in REDUCING else None
    # per-rank block of count elements; the largest buffer (n blocks for gather/scatter/all_to_all) <= max
    blocks = n if coll in ("all_gather", "reduce_scatter", "all_to_all") else 1
    top = max(1, args.max_bytes // (item * blocks))
    count = int(np.exp(rng.uniform(0.0, np.log(top))))
    if rng.random() < 0.5:
        count |= 1  # odd counts half the time
    count = max(1, min(top, count))
    choices = [None] + list(algos.get(coll, []))
    return {
        "i": i, "coll": coll, "dtype": name, "op": None if op is None else op.value, "_op": op, "count": count,
        "root": int(rng.integers(n)), "algo": choices[int(rng.integers(len(choices)))],
        "inplace": bool(rng.random() < 0.35) and coll != "sendrecv",
        "registered": bool(rng.random() < args.registered), "shift": int(rng.integers(1, n)) if n > 1 else 0,
        "misalign": int(rng.integers(0, 4)) if rng.random() < 0.3 else 0,
        "offs": rng.integers(0, 1 << 62, n),
    }


def run_case(comm: Any, c: Dict[str, Any], pools: Pools, arenas: Dict[str, Arena], stream: Any) -> Optional[str]:
    gpu = pools.gpu
    n, me = comm.size, comm.rank
    name, coll, count, op, root = c["dtype"], c["coll"], c["count"], c["_op"], c["root"]
    in_elems = count * (n if coll in ("reduce_scatter", "all_to_all") else 1)
    out_elems = count * (n if coll in ("all_gather", "all_to_all") else 1)
    hpool, dpool = pools.get(name, "prod" if op is PROD else "gen")
    span = len(hpool) - in_elems
    offs = [int(o % (span + 1)) for o in c["offs"]]
    # device buffers: registered arenas (A, B) or staged ones (C, D); misaligned by a few elements
    a, b = ("A", "B") if c["registered"] else ("C", "D")
    mis = c["misalign"]
    send = arenas[a].view(name, in_elems, mis)
    with stream:
        send[...] = dpool[offs[me]:offs[me] + in_elems]
    if c["inplace"]:
        if coll == "all_gather":  # this rank's block of the output is the input
            recv = arenas[b].view(name, out_elems, mis)
            send = recv[me * count:(me + 1) * count]
            with stream:
                recv.view(np.uint8).fill(POISON)
                send[...] = dpool[offs[me]:offs[me] + count]
        elif coll == "reduce_scatter":
            recv = send[me * count:(me + 1) * count]
        else:
            recv = send
    else:
        recv = arenas[b].view(name, out_elems, mis)
        with stream:
            recv.view(np.uint8).fill(POISON)
    bf = name == "bfloat16" and gpu
    S, R = (as_bf16(send), as_bf16(recv)) if bf else (send, recv)
    stream.synchronize()  # inputs made on this stream by CuPy, before the collective reads them
    if c["algo"] is not None:
        comm._planner.force(coll, c["algo"])
    try:
        st = stream if gpu else None
        if coll == "all_reduce":
            comm.all_reduce(S, None if c["inplace"] else R, op, stream=st)
        elif coll == "reduce":
            comm.reduce(S, None if c["inplace"] else R, root, op, stream=st)
        elif coll == "broadcast":
            comm.broadcast(S, root, recvbuf=None if c["inplace"] else R, stream=st)
        elif coll == "all_gather":
            comm.all_gather(S, R, stream=st)
        elif coll == "reduce_scatter":
            comm.reduce_scatter(S, R, op, stream=st)
        elif coll == "all_to_all":
            comm.all_to_all(S, R, stream=st)
        else:
            k = c["shift"]
            with comm.group():
                comm.send(S, (me + k) % n, stream=st)
                comm.recv(R, (me - k) % n, stream=st)
        stream.synchronize()
        comm.synchronize()  # an asynchronous failure (a kernel's timeout) raises here, before the check
    finally:
        if c["algo"] is not None:
            comm._planner.force(coll, None)
    got = recv.get() if gpu else recv.copy()
    if CORRUPT[0] and coll == "all_reduce" and me == 1 % n and c["i"] % CORRUPT[0] == 0 and got.size:
        got.view(np.uint8)[0] ^= 0x40  # --corrupt-every: the campaign's own check must catch this
    if bf:
        got = got.view(bfloat16)

    def inp(r: int, lo: int = 0, hi: Optional[int] = None) -> np.ndarray:
        hi = in_elems if hi is None else hi
        return hpool[offs[r] + lo:offs[r] + hi]
    if coll == "all_reduce":
        want = reference(name, op, [inp(r) for r in range(n)])
    elif coll == "reduce":
        if me != root:
            if c["inplace"]:
                return mismatch(name, got, inp(me))  # a non-root's buffer is its input, untouched
            return mismatch("uint8", got.view(np.uint8), np.full(got.nbytes, POISON, np.uint8))
        want = reference(name, op, [inp(r) for r in range(n)])
    elif coll == "broadcast":
        want = inp(root)
    elif coll == "all_gather":
        want = np.concatenate([inp(r, 0, count) for r in range(n)])
    elif coll == "reduce_scatter":
        want = reference(name, op, [inp(r, me * count, (me + 1) * count) for r in range(n)])
    elif coll == "all_to_all":
        want = np.concatenate([inp(r, me * count, (me + 1) * count) for r in range(n)])
    else:
        want = inp((me - c["shift"]) % n)
    return mismatch(name, got, want)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--max-bytes", type=parse_size, default=64 << 20, help="largest buffer per rank")
    ap.add_argument("--registered", type=float, default=0.3, help="share of cases on registered buffers")
    ap.add_argument("--json", default="")
    ap.add_argument("--mem", choices=("cuda", "host"), default="cuda",
                    help="host: a dry run on host buffers (checks the campaign itself where there is no GPU)")
    ap.add_argument("--corrupt-every", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    CORRUPT[0] = args.corrupt_every
    import hpccl
    comm = hpccl.Communicator()
    gpu = args.mem == "cuda"
    torch: Any = None
    if gpu:
        import cupy
        from hpccl.gpu.device import rank_device
        dev = rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())
        cupy.cuda.Device(dev).use()
        try:
            import torch
            torch.cuda.set_device(dev)
        except Exception:  # noqa: BLE001 - bfloat16 cases need torch; without it they are left out
            torch = None
    n, me = comm.size, comm.rank
    algos = {coll: [a for a in comm.algorithms(coll, args.mem) if a != "hot"] for coll in COLLS if coll != "sendrecv"}
    pools = Pools(args.max_bytes + (1 << 20), args.seed, gpu)
    size = args.max_bytes + 4096
    arenas = {k: Arena(size, gpu) for k in "ABCD"}
    if gpu:
        comm.register(arenas["A"].whole)
        comm.register(arenas["B"].whole)
        stream: Any = cupy.cuda.Stream(non_blocking=True)
    else:
        args.registered = 0.0
        stream = HostStream()
    eng = comm._dev.engine if comm._dev is not None else None
    if me == 0:
        print(f"campaign: {n} ranks, {args.cases} cases, seed {args.seed}, up to {args.max_bytes} B per buffer; "
              f"algorithms {algos}; " + (f"blocks per kernel <= {eng.maxb} ({eng.share} rank(s) per GPU, "
                                        f"{eng.peers.sms} SMs), {eng.p2p_blocks} per send/recv" if eng else
                                        "no node kernels (network layout)"), flush=True)
    counts: Dict[str, int] = {}
    wrong: List[Dict[str, Any]] = []
    t0 = time.time()
    done = 0
    for i in range(args.cases):
        c = draw(i, args, n, algos)
        if c["dtype"] == "bfloat16" and gpu and torch is None:
            continue
        key = f"{c['coll']}/{c['algo'] or 'auto'}/{'reg' if c['registered'] else 'staged'}"
        counts[key] = counts.get(key, 0) + 1
        try:
            err = run_case(comm, c, pools, arenas, stream)
        except Exception as exc:  # noqa: BLE001 - a raised case is a failed case; report and stop
            err = f"raised {type(exc).__name__}: {exc}"
            wrong.append({k: v for k, v in c.items() if not k.startswith("_") and k != "offs"} | {"error": err})
            print(f"rank {me} case {i} {key} {c['dtype']} n={c['count']}: {err}", flush=True)
            break
        done += 1
        if err:
            wrong.append({k: v for k, v in c.items() if not k.startswith("_") and k != "offs"} | {"error": err})
            print(f"rank {me} WRONG case {i} {key} {c['dtype']} {c['op']} n={c['count']} root={c['root']} "
                  f"inplace={c['inplace']} misalign={c['misalign']}: {err}", flush=True)
    secs = time.time() - t0
    tot_wrong = comm.mpi_comm.allreduce(len(wrong))
    tot_done = comm.mpi_comm.allreduce(done)
    if me == 0:
        print(f"campaign: {n} ranks: {tot_done // n} cases per rank run, {tot_wrong} wrong or failed (all ranks), "
              f"{secs:.1f} s", flush=True)
        print("cases by collective/algorithm/buffers: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
              flush=True)
    if args.json:
        allw = comm.mpi_comm.gather(wrong, root=0)
        if me == 0:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "cases": args.cases, "run": tot_done // n, "wrong": tot_wrong,
                           "seconds": secs, "seed": args.seed, "max_bytes": args.max_bytes,
                           "by_kind": counts, "failures": [w for ws in allw for w in ws]}, f, indent=1)
    if gpu:
        comm.deregister(arenas["A"].whole)
        comm.deregister(arenas["B"].whole)
    comm.destroy()
    return 1 if tot_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
