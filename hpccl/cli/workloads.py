"""What each collective means for a benchmark: buffer sizes, bus-bandwidth factor, inputs and the
expected result, shared by hpccl-perf's timing, its --check and the baselines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..ops import AVG, MAX, MIN, PROD, SUM, UFUNC, ReduceOp, floating

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter",
               "all_gather_v", "reduce_scatter_v")
#: uneven blocks: rank r's block is (r + 1) units, a unit being size / (n (n + 1) / 2) elements
UNEVEN = ("all_gather_v", "reduce_scatter_v")
ROOTED = ("broadcast", "reduce", "gather", "scatter")


@dataclass(frozen=True)
class Workload:
    """``size`` is the bytes of the full buffer as nccl-tests report it; ``count`` its elements;
    ``counts`` every rank's block (the uneven collectives; None for the others); send and receive counts are
    the calling rank's."""

    coll: str
    size: int
    count: int
    send_count: int
    recv_count: int
    busbw_factor: float
    counts: Optional[Tuple[int, ...]] = None


def workload(coll: str, size: int, itemsize: int, n: int, rank: int = 0) -> Workload:
    """Round size down to whole elements (and whole blocks of n for the per-rank collectives, whole units
    of n (n + 1) / 2 for the uneven ones)."""
    if coll in UNEVEN:
        unit = size // itemsize // (n * (n + 1) // 2)
        counts = tuple((q + 1) * unit for q in range(n))
        count = sum(counts)
        fac = (n - 1) / n if n > 1 else 1.0
        send, recv = (counts[rank], count) if coll == "all_gather_v" else (count, counts[rank])
        return Workload(coll, count * itemsize, count, send, recv, fac, counts)
    per_rank = coll in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
    unit = itemsize * (n if per_rank else 1)
    count = (size // unit) * (n if per_rank else 1)
    fac = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
           "all_to_all": (n - 1) / n, "gather": (n - 1) / n, "scatter": (n - 1) / n}.get(coll, 1.0) if n > 1 else 1.0
    send = count // n if coll in ("all_gather", "gather") else count
    recv = count // n if coll in ("reduce_scatter", "scatter") else count
    return Workload(coll, count * itemsize, count, send, recv, fac)


def fill(count: int, dtype: np.dtype, rank: int, op: ReduceOp, salt: int = 0) -> np.ndarray:
    """Small exact values, so sums and products are exact in every dtype, including int8 and bfloat16."""
    i = np.arange(count, dtype=np.int64)
    if op is PROD:
        vals = 1 + ((i + rank + salt) % 7 == 0)
    else:
        vals = (i * 7 + rank * 3 + salt) % 11
        if dtype.kind in "iu" and op in (MIN, MAX) and dtype.kind == "i":
            vals = vals - 5
    return vals.astype(dtype)


def expected(wl: Workload, dtype: np.dtype, op: ReduceOp, n: int, rank: int, root: int) -> np.ndarray:
    """The result rank ``rank`` must hold, computed with numpy from every rank's inputs."""
    if wl.coll == "all_gather_v":
        return np.concatenate([fill(c, dtype, q, op) for q, c in enumerate(wl.counts)])
    ins = [fill(wl.send_count, dtype, q, op) for q in range(n)]
    if wl.coll in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v"):
        acc = ins[0].astype(np.float64 if floating(dtype) else dtype)
        for x in ins[1:]:
            acc = UFUNC[op](acc, x.astype(acc.dtype))
        if op is AVG:
            acc = acc / n
        out = acc.astype(dtype)
        if wl.coll == "reduce_scatter":
            c = wl.recv_count
            out = out[rank * c:(rank + 1) * c]
        elif wl.coll == "reduce_scatter_v":
            at = sum(wl.counts[:rank])
            out = out[at:at + wl.counts[rank]]
        return out
    if wl.coll == "broadcast":
        return ins[root]
    if wl.coll in ("all_gather", "gather"):
        return np.concatenate(ins)
    if wl.coll == "scatter":
        c = wl.recv_count
        return ins[root][rank * c:(rank + 1) * c]
    if wl.coll == "all_to_all":
        c = wl.count // n
        return np.concatenate([ins[q][rank * c:(rank + 1) * c] for q in range(n)])
    raise ValueError(wl.coll)


def wrong(got: np.ndarray, want: np.ndarray, op: ReduceOp) -> int:
    """Elements that differ; floating avg may differ in the last bit of its dtype."""
    if got.size == 0:
        return 0
    if op is AVG:
        g, w = got.astype(np.float64), want.astype(np.float64)
        import ml_dtypes  # its finfo knows bfloat16 (imported only for avg: see ops.bfloat16_dtype)
        tol = 4 * float(ml_dtypes.finfo(got.dtype).eps)
        return int(np.count_nonzero(np.abs(g - w) > tol * np.maximum(1.0, np.abs(w))))
    gb, wb = got.view(np.uint8).reshape(got.size, -1), want.view(np.uint8).reshape(want.size, -1)
    return int(np.count_nonzero(np.any(gb != wb, axis=1)))


OPS: Dict[str, ReduceOp] = {"sum": SUM, "prod": PROD, "min": MIN, "max": MAX, "avg": AVG}
Runner = Callable[[], None]
Buffers = Tuple[np.ndarray, np.ndarray]
