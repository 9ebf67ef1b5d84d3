"""Host memory: copies and reductions on numpy views, in place, with numpy ufuncs."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from .interop import host_view, writable
from ..ops import AVG, UFUNC, ReduceOp, supported

__all__ = ["copy", "reduce", "scale_avg", "finish", "empty", "view", "dtype", "writable", "empty_out", "shares",
           "same", "stream", "clone", "kind", "blocking"]


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


# ----- the rest of the memory component interface (see memory.cuda.DeviceMemory) ----------------------
kind = "host"
blocking = True


def view(obj: Any, name: str) -> Tuple[np.ndarray, Any]:
    """(flat view, the array as given): numpy, buffer-protocol objects, torch CPU tensors."""
    if type(obj) is np.ndarray and obj.flags.c_contiguous and supported(obj.dtype):
        return (obj if obj.ndim == 1 else obj.reshape(-1)), obj  # the common case, checked cheaply
    return host_view(obj, name)


def dtype(flat: np.ndarray) -> np.dtype:
    return flat.dtype


def empty_out(shape: Tuple[int, ...], like_obj: Any, like_flat: np.ndarray) -> Tuple[np.ndarray, Any]:
    out = np.empty(shape, dtype=like_flat.dtype)
    return out.reshape(-1), out


def shares(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two views overlap; two arrays that each own their memory cannot (checked first: cheap)."""
    return not (a.base is None and b.base is None) and np.may_share_memory(a, b) and np.shares_memory(a, b)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """The two views cover exactly the same memory."""
    return (a.nbytes == b.nbytes
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def stream(stream: Any, like_obj: Any) -> None:
    """Host calls complete before they return; a stream argument has nothing to order."""
    return None


def clone(a: np.ndarray, stream: Any = None) -> np.ndarray:
    return a.copy()
