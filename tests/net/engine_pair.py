"""Two network engines of one process connected to each other over UCX's TCP (ranks 0 and 1 of a world of
two): what the engine's CPU tests drive."""
from __future__ import annotations

from typing import Any, Tuple


def engine_pair(ne: Any) -> Tuple[Any, Any]:
    """(rank 0's engine, rank 1's engine) from the _netengine module ``ne``, connected; the caller closes them."""
    a = ne.Engine(0, 2, {"TLS": "tcp,self"})
    b = ne.Engine(1, 2, {"TLS": "tcp,self"})
    addrs = [a.address(), b.address()]
    a.connect(addrs, [False, True])
    b.connect(addrs, [True, False])
    return a, b
