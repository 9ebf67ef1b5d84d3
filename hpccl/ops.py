"""Reduction operators and the datatypes hpccl supports, with which op is valid for which dtype."""
from __future__ import annotations

import enum
from typing import Dict, Union

import ml_dtypes
import numpy as np

from .errors import HpcclInvalidArgument


class ReduceOp(enum.Enum):
    """The reductions of NCCL: sum, prod, min, max, avg (avg only for floating types)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


SUM, PROD, MIN, MAX, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG
_BY_NAME = {o.value: o for o in ReduceOp}

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: name -> numpy dtype for every supported datatype
DTYPES: Dict[str, np.dtype] = {
    name: np.dtype(dt) for name, dt in [
        ("int8", np.int8), ("uint8", np.uint8), ("int32", np.int32), ("uint32", np.uint32),
        ("int64", np.int64), ("uint64", np.uint64), ("float16", np.float16),
        ("bfloat16", ml_dtypes.bfloat16), ("float32", np.float32), ("float64", np.float64)]
}
SUPPORTED = frozenset(DTYPES.values())
FLOATING = {DTYPES[n] for n in ("float16", "bfloat16", "float32", "float64")}

#: the ufunc that combines two operands for each op (avg sums, then scales once at the end)
UFUNC = {SUM: np.add, PROD: np.multiply, MIN: np.minimum, MAX: np.maximum, AVG: np.add}


def as_op(op: Union[ReduceOp, str], argument: str = "op") -> ReduceOp:
    """Accept a ReduceOp or its name ('sum', 'max', ...)."""
    if op.__class__ is ReduceOp:
        return op
    if isinstance(op, str):
        found = _BY_NAME.get(op) or _BY_NAME.get(op.lower())
        if found is not None:
            return found
    raise HpcclInvalidArgument(argument, f"{op!r} is not a reduction op; use one of "
                                         f"{', '.join(o.value for o in ReduceOp)}")


def check_dtype(dtype: np.dtype, argument: str) -> np.dtype:
    """Raise unless hpccl can move and reduce this dtype."""
    if dtype not in SUPPORTED:
        raise HpcclInvalidArgument(argument, f"dtype {dtype} is not supported; use one of "
                                             f"{', '.join(DTYPES)}")
    return dtype


def check_op_dtype(op: ReduceOp, dtype: np.dtype, argument: str = "op") -> None:
    """avg is defined only on floating types (an integer mean would silently truncate)."""
    if op is AVG and dtype not in FLOATING:
        raise HpcclInvalidArgument(argument, f"avg is not defined for integer dtype {dtype}; "
                                             "use sum and divide, or a floating dtype")


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == bfloat16 else str(dtype)
