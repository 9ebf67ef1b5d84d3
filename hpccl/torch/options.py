"""torch's collective Options and arguments, read into hpccl's: the reduce op (PREMUL_SUM as a scaled SUM),
the Options object torch's overloads would build, flat views, and all_to_all's row splits."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..errors import HpcclInvalidArgument
from ..ops import AVG, MAX, MIN, PROD, SUM

_T = dist.ReduceOp.RedOpType
_RED = {_T.SUM: SUM, _T.PRODUCT: PROD, _T.MIN: MIN, _T.MAX: MAX, _T.AVG: AVG}


def reduce_op(opts: Any) -> Tuple[Any, Optional[float]]:
    """(hpccl op, premul factor or None): PREMUL_SUM is a SUM of inputs scaled by its factor."""
    r = opts.reduceOp
    kind = getattr(r, "op", r)  # a ReduceOp carries its RedOpType
    ours = _RED.get(kind)
    if ours is not None:
        return ours, None
    if kind == _T.PREMUL_SUM:
        f = getattr(r, "factor", None)
        if f is None:  # torch <= 2.12 exposes the factor only through the op's pickled state
            try:
                f = r.__getstate__()[1]
            except Exception:  # noqa: BLE001 - no such state in this version
                f = None
        if f is None:
            raise HpcclInvalidArgument("op", "PREMUL_SUM without a readable factor in this torch version")
        return SUM, float(f.item() if isinstance(f, torch.Tensor) else f)
    raise HpcclInvalidArgument("op", f"torch ReduceOp {r} is not supported by hpccl (SUM, PRODUCT, MIN, MAX, "
                                     "AVG, PREMUL_SUM)")


def scaled(t: torch.Tensor, factor: Optional[float]) -> torch.Tensor:
    """The input a premul sum reduces: a scaled copy (the caller's input is never changed)."""
    return t if factor is None else t * factor


def options(opts: Any, cls: Any, op: Any = None, root: Optional[int] = None) -> Any:
    """The Options torch's pybind overloads would build: callers pass Options, a ReduceOp, a root, or none."""
    if isinstance(opts, cls):
        return opts
    o = cls()
    if isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        op = opts
    elif isinstance(opts, int):
        root = opts
    if op is not None:
        o.reduceOp = op if isinstance(op, dist.ReduceOp) else dist.ReduceOp(op)
    if root is not None:
        o.rootRank = root
    return o


def asynchronous(opts: Any) -> bool:
    """False for a call torch waits on at once (asyncOp false: dist.* with async_op=False, torch >= 2.8);
    True for C++ callers (DDP's reducer), async_op=True and torch versions without the field."""
    return opts is None or getattr(opts, "asyncOp", True)


def as_list(x: Any) -> List[Any]:
    return [x] if isinstance(x, torch.Tensor) else x


def flat(t: torch.Tensor, name: str) -> torch.Tensor:
    """A 1-D view of a contiguous tensor (the tensor itself when already 1-D); ``name`` is the argument."""
    if not t.is_contiguous():
        raise HpcclInvalidArgument(name, "tensor is not contiguous; pass t.contiguous()")
    return t if t.dim() == 1 else t.view(-1)


def splits(sizes: Sequence[int], t: torch.Tensor, n: int, name: str) -> List[int]:
    """Rows of dim 0 per rank: as given (checked to add up), or equal when empty."""
    rows = t.shape[0] if t.dim() else t.numel()
    if not sizes:
        if rows % n:
            raise HpcclInvalidArgument(name, f"empty, and {rows} rows do not split evenly over {n} ranks")
        return [rows // n] * n
    sizes = list(sizes)
    if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
        raise HpcclInvalidArgument(name, f"{sizes} does not split {rows} rows over {n} ranks")
    return sizes
