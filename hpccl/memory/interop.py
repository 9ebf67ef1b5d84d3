"""Turning user buffers (numpy, buffer-protocol objects, PyTorch CPU tensors, CUDA arrays) into flat views.

A view shares memory with the user's object, so results land in place; nothing is copied here."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ..errors import HpcclInvalidArgument
from ..ops import FP8_NAMES, bfloat16_dtype, check_dtype, ml_dtype

HOST, CUDA = "host", "cuda"
_KIND_BY_TYPE = {np.ndarray: HOST}


def memory_kind(obj: Any) -> str:
    """'cuda' for objects exposing __cuda_array_interface__ (CuPy, Numba) or CUDA torch tensors."""
    t = type(obj)
    kind = _KIND_BY_TYPE.get(t)
    if kind is not None:
        return kind
    if t.__module__.startswith("torch"):  # per instance: one tensor type serves every device
        return CUDA if getattr(obj, "is_cuda", False) else HOST
    # asking hasattr builds CuPy's interface dict each time, so remember the answer per type
    kind = CUDA if hasattr(obj, "__cuda_array_interface__") else HOST
    _KIND_BY_TYPE[t] = kind
    return kind


def _torch_cpu(obj: Any) -> np.ndarray:
    import torch
    if obj.dtype == torch.bfloat16:
        return obj.detach().view(torch.int16).numpy().view(bfloat16_dtype())
    name = str(obj.dtype)[6:]  # numpy has no view of torch's float8: the bytes seen as ml_dtypes' type
    if name in FP8_NAMES:
        return obj.detach().view(torch.uint8).numpy().view(ml_dtype(name))
    return obj.detach().numpy()


def host_view(obj: Any, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """(flat 1-D view, array as given) sharing the object's memory; non-contiguous input is refused."""
    if isinstance(obj, np.ndarray):
        arr = obj
    elif type(obj).__module__.startswith("torch"):
        arr = _torch_cpu(obj)
    else:
        try:
            arr = np.asarray(memoryview(obj))
        except TypeError:
            raise HpcclInvalidArgument(name, f"{type(obj).__name__} is not an array or buffer") from None
    if not arr.flags.c_contiguous:
        raise HpcclInvalidArgument(name, "buffer is not C-contiguous; pass a contiguous array "
                                         "(np.ascontiguousarray) so results can be written in place")
    check_dtype(arr.dtype, name)
    return (arr if arr.ndim == 1 else arr.reshape(-1)), arr


def writable(flat: np.ndarray, name: str) -> None:
    if not flat.flags.writeable:
        raise HpcclInvalidArgument(name, "buffer is read-only; the result must be written into it")
