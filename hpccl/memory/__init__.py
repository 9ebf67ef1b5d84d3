"""Memory components: how to view, validate, copy, reduce and allocate each memory kind (host: numpy;
cuda: CuPy views with hpccl's kernels). The front end and the algorithms see only this interface."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import host


def reduce(dst: Any, a: Any, b: Any, op: Any) -> None:
    """dst = a op b on whatever memory dst lives in (what transports call to combine received data)."""
    if isinstance(dst, np.ndarray):
        host.reduce(dst, a, b, op)
    else:
        from .cuda import blocking_memory
        blocking_memory(dst).reduce(dst, a, b, op)


def copy(dst: Any, src: Any) -> None:
    """dst[:] = src on dst's memory; src may be host memory when dst is on a GPU (a staged receive)."""
    if isinstance(dst, np.ndarray):
        host.copy(dst, src)
    elif isinstance(src, np.ndarray):
        import cupy
        dst.set(src.view(dst.dtype))
        cupy.cuda.get_current_stream().synchronize()
    else:
        from .cuda import blocking_memory
        blocking_memory(dst).copy(dst, src)
