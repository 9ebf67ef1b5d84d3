"""HPCCL_CHECK=1: before every collective the ranks agree on what they are calling (collective, bytes,
dtype, op, root, memory kind), so a desynchronised program fails on every rank with the ranks that differ
and what each called, instead of hanging or mixing buffers. Costs one small host all_gather per call."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ..errors import HpcclError, HpcclInvalidUsage, HpcclRemoteError
from ..ops import DTYPES, ReduceOp, dtype_name

COLLECTIVES = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier",
               "all_to_all_v"]
_DTYPES = list(DTYPES)  # by name: reading bfloat16's dtype would import ml_dtypes
_OPS = list(ReduceOp)
_KINDS = ["host", "cuda"]
UNCHECKED = -1  # a field this call does not fix across ranks (all_to_all_v's bytes, a dtype-less barrier)


def signature(call: Any) -> np.ndarray:
    """The call as 6 int64: collective, bytes, dtype, op, root, memory kind (UNCHECKED where free)."""
    coll = COLLECTIVES.index(call.coll) if call.coll in COLLECTIVES else UNCHECKED
    dt = UNCHECKED
    if call.args and call.coll != "all_to_all_v":
        try:
            d = dtype_name(np.dtype(call.mem.dtype(call.args[0])))
            dt = _DTYPES.index(d) if d in _DTYPES else UNCHECKED
        except (TypeError, AttributeError):
            dt = UNCHECKED
    nbytes = UNCHECKED if call.coll == "all_to_all_v" else int(call.nbytes)
    op = _OPS.index(call.op) if call.op in _OPS else UNCHECKED
    root = int(call.args[2]) if call.coll in ("reduce", "broadcast") and len(call.args) > 2 else UNCHECKED
    kind = _KINDS.index(call.mem.kind) if getattr(call.mem, "kind", None) in _KINDS else UNCHECKED
    return np.array([coll, nbytes, dt, op, root, kind], dtype=np.int64)


def describe(sig: np.ndarray) -> str:
    coll, nbytes, dt, op, root, kind = (int(v) for v in sig)
    parts = [COLLECTIVES[coll] if coll >= 0 else "?"]
    if nbytes >= 0:
        parts.append(f"{nbytes} B")
    if dt >= 0:
        parts.append(_DTYPES[dt])
    if op >= 0:
        parts.append(_OPS[op].value)
    if root >= 0:
        parts.append(f"root {root}")
    if kind >= 0:
        parts.append(_KINDS[kind] + " memory")
    return " ".join(parts)


def disagreement(table: np.ndarray) -> List[Tuple[List[int], str]]:
    """[(ranks, what they called)] when the rows of ``table`` (one per rank) differ, else []."""
    groups: Dict[bytes, List[int]] = {}
    for r, row in enumerate(table):
        groups.setdefault(row.tobytes(), []).append(r)
    if len(groups) == 1:
        return []
    return [(ranks, describe(table[ranks[0]])) for ranks in sorted(groups.values())]


def agree(comm: Any, call: Any, gather: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """Exchange this call's signature with every rank (``gather(mine, table)``: the communicator's host
    all_gather, handed in by core so that observe imports no algorithm) and raise HpcclInvalidUsage on every
    rank if they differ."""
    mine = signature(call)
    table = np.empty(comm.size * mine.size, dtype=np.int64)
    gather(mine, table)
    diff = disagreement(table.reshape(comm.size, mine.size))
    if diff:
        what = "; ".join(f"rank(s) {ranks}: {desc}" for ranks, desc in diff)
        raise HpcclInvalidUsage(f"HPCCL_CHECK: call #{comm._seq} differs across ranks: {what}")


def before(comm: Any, call: Any, rec: list, gather: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """HPCCL_CHECK: the ranks compare what they are about to call. A mismatch is a usage error found by
    every rank before any data of the call moved, so the communicator stays usable (no abort: an abort
    would reach ranks still comparing and hide the mismatch from them); a failed exchange aborts."""
    comm._waiter.collective = f"HPCCL_CHECK before {call.coll}"
    try:
        agree(comm, call, gather)
    except HpcclInvalidUsage:
        comm._rec.end(rec, "failed: HpcclInvalidUsage")
        raise
    except HpcclError as exc:
        comm._rec.end(rec, f"failed: {type(exc).__name__}")
        comm.abort(exc.rank if isinstance(exc, HpcclRemoteError) else None)
        raise
    finally:
        comm._waiter.collective = call.coll
