"""Reduction operators and the datatypes hpccl supports, with which op is valid for which dtype."""
from __future__ import annotations

import enum
import sys
from typing import Any, Iterator, Mapping, Optional, Union

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

_BF16: Optional[np.dtype] = None


def bfloat16_dtype() -> np.dtype:
    """numpy's bfloat16 (ml_dtypes'), imported at first use: ml_dtypes 0.7 takes about a second to import
    (numpy's ufunc loop registration, quadratic in its many types), which every rank would pay at start."""
    global _BF16
    if _BF16 is None:
        import ml_dtypes
        _BF16 = np.dtype(ml_dtypes.bfloat16)
    return _BF16


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` is bfloat16, without importing ml_dtypes: no array has its bfloat16 before it is."""
    return "ml_dtypes" in sys.modules and dtype == bfloat16_dtype()


_NAMES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64")
_PLAIN = {name: np.dtype(name) for name in _NAMES if name != "bfloat16"}
_SUPPORTED_PLAIN = frozenset(_PLAIN.values())
_FLOATING_PLAIN = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


class _Dtypes(Mapping):
    """name -> numpy dtype of every supported datatype, in NCCL's order; bfloat16's made when read."""

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bfloat16":
            return bfloat16_dtype()
        return _PLAIN[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def __contains__(self, name: object) -> bool:
        return name in _NAMES  # Mapping's would read the value


#: name -> numpy dtype for every supported datatype
DTYPES: Mapping[str, np.dtype] = _Dtypes()


def supported(dtype: Any) -> bool:
    return dtype in _SUPPORTED_PLAIN or is_bfloat16(dtype)


def floating(dtype: Any) -> bool:
    return dtype in _FLOATING_PLAIN or is_bfloat16(dtype)


def __getattr__(name: str) -> Any:
    """bfloat16, SUPPORTED and FLOATING (sets with bfloat16 in them) import ml_dtypes when first read."""
    if name == "bfloat16":
        return bfloat16_dtype()
    if name == "SUPPORTED":
        return _SUPPORTED_PLAIN | {bfloat16_dtype()}
    if name == "FLOATING":
        return _FLOATING_PLAIN | {bfloat16_dtype()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    if not supported(dtype):
        raise HpcclInvalidArgument(argument, f"dtype {dtype} is not supported; use one of "
                                             f"{', '.join(DTYPES)}")
    return dtype


def check_op_dtype(op: ReduceOp, dtype: np.dtype, argument: str = "op") -> None:
    """avg is defined only on floating types (an integer mean would silently truncate)."""
    if op is AVG and not floating(dtype):
        raise HpcclInvalidArgument(argument, f"avg is not defined for integer dtype {dtype}; "
                                             "use sum and divide, or a floating dtype")


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if is_bfloat16(dtype) else str(dtype)
