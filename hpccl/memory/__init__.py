"""Memory components: how to view, validate, copy, reduce and allocate each memory kind (host: numpy;
cuda: CuPy views with hpccl's kernels). The front end and the algorithms see only this interface."""
from __future__ import annotations

from typing import Any, Optional, Tuple

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


def unalias(m: Any, send: Any, recv: Any, stream: Any, key: Any, block: Optional[int] = None) -> Tuple[Any, Any]:
    """(input, fast-path key) for memory component m: an input that overlaps the output other than as the
    output itself (or, for all_gather and reduce_scatter, as this rank's own block ``block``) is copied first;
    a call that needed the copy is never replayed from a snapshot (the copy is new each time)."""
    out = _overlap(m, send, recv, stream, block)
    return out, (key if out is send or m.same(out, send) else None)


def _overlap(m: Any, send: Any, recv: Any, stream: Any, block: Optional[int]) -> Any:
    if send is recv or not m.shares(send, recv):
        return send
    if block is None:
        return recv if m.same(send, recv) else m.clone(send, stream)
    big, small = (recv, send) if recv.size > send.size else (send, recv)
    c = small.size
    return send if m.same(big[block * c:(block + 1) * c], small) else m.clone(send, stream)
