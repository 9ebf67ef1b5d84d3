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

_ML: dict = {}  # name -> numpy dtype of ml_dtypes' types read so far
#: the types numpy has only through ml_dtypes, imported at first use
ML_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
#: the 1-byte floats: moved as bytes, reduced in float32 and rounded once (hpccl/core/fp8.py)
FP8_NAMES = ("float8_e4m3fn", "float8_e5m2")


def ml_dtype(name: str) -> np.dtype:
    """numpy's bfloat16 or float8 type (ml_dtypes'), imported at first use: ml_dtypes 0.7 takes about a
    second to import (numpy's ufunc loop registration, quadratic in its many types), which every rank would
    pay at start."""
    dt = _ML.get(name)
    if dt is None:
        import ml_dtypes
        dt = _ML[name] = np.dtype(getattr(ml_dtypes, name))
    return dt


def bfloat16_dtype() -> np.dtype:
    """numpy's bfloat16 (ml_dtypes'), imported at first use (see ml_dtype)."""
    return ml_dtype("bfloat16")


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` is bfloat16, without importing ml_dtypes: no array has its bfloat16 before it is."""
    return "ml_dtypes" in sys.modules and dtype == bfloat16_dtype()


def fp8_name(dtype: Any) -> Optional[str]:
    """'float8_e4m3fn' or 'float8_e5m2' for those dtypes, else None (without importing ml_dtypes)."""
    if "ml_dtypes" not in sys.modules or getattr(dtype, "itemsize", 0) != 1:
        return None
    for name in FP8_NAMES:
        if dtype == ml_dtype(name):
            return name
    return None


def is_fp8(dtype: Any) -> bool:
    return fp8_name(dtype) is not None


def _ml_kind(dtype: Any) -> bool:
    """bfloat16 or a float8 (all of them floating)."""
    return dtype_name(dtype) in ML_NAMES


_NAMES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64",
          "float8_e4m3fn", "float8_e5m2")
_PLAIN = {name: np.dtype(name) for name in _NAMES if name not in ML_NAMES}
_SUPPORTED_PLAIN = frozenset(_PLAIN.values())
_FLOATING_PLAIN = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


class _Dtypes(Mapping):
    """name -> numpy dtype of every supported datatype; ml_dtypes' (bfloat16, float8) made when read."""

    def __getitem__(self, name: str) -> np.dtype:
        if name in ML_NAMES:
            return ml_dtype(name)
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
    return dtype in _SUPPORTED_PLAIN or _ml_kind(dtype)


def floating(dtype: Any) -> bool:
    return dtype in _FLOATING_PLAIN or _ml_kind(dtype)


def __getattr__(name: str) -> Any:
    """bfloat16, float8_e4m3fn, float8_e5m2, SUPPORTED and FLOATING (sets with them in) import ml_dtypes
    when first read."""
    if name in ML_NAMES:
        return ml_dtype(name)
    if name == "SUPPORTED":
        return _SUPPORTED_PLAIN | {ml_dtype(n) for n in ML_NAMES}
    if name == "FLOATING":
        return _FLOATING_PLAIN | {ml_dtype(n) for n in ML_NAMES}
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
    """The registry's name of a dtype (ml_dtypes' types by their names, not numpy's void spelling)."""
    if "ml_dtypes" in sys.modules and getattr(dtype, "itemsize", 0) in (1, 2) and dtype not in _SUPPORTED_PLAIN:
        for name in ML_NAMES:
            if dtype == ml_dtype(name):
                return name
    return str(dtype)
