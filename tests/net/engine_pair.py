"""Network engines of one process connected to each other over UCX's TCP (ranks 0..n-1 of a world of n):
what the engine's CPU tests drive."""
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


def engine_world(ne: Any, n: int) -> Tuple[Any, ...]:
    """n engines, ranks 0..n-1 of one world, every pair connected; the caller closes them."""
    engs = [ne.Engine(r, n, {"TLS": "tcp,self"}) for r in range(n)]
    addrs = [e.address() for e in engs]
    for r, e in enumerate(engs):
        e.connect(addrs, [p < r for p in range(n)])
    return tuple(engs)
