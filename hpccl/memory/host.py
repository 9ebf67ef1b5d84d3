"""Host memory: copies and reductions on numpy views, in place, with numpy ufuncs."""
from __future__ import annotations

import numpy as np

from ..ops import AVG, UFUNC, ReduceOp


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src for two views of equal byte length."""
    np.copyto(dst, src, casting="no")


def reduce(dst: np.ndarray, a: np.ndarray, b: np.ndarray, op: ReduceOp) -> None:
    """dst = a (op) b, elementwise; dst may alias a or b."""
    UFUNC[op](a, b, out=dst)


def scale_avg(buf: np.ndarray, nranks: int) -> None:
    """Turn a sum into the mean over nranks (the last step of avg)."""
    np.divide(buf, buf.dtype.type(nranks), out=buf)


def finish(buf: np.ndarray, op: ReduceOp, nranks: int) -> None:
    """Apply what an op needs after its reduction (only avg needs anything)."""
    if op is AVG:
        scale_avg(buf, nranks)


def empty(count: int, dtype: np.dtype) -> np.ndarray:
    return np.empty(count, dtype=dtype)
