"""Network engines of one process connected to each other over UCX's TCP (ranks 0..n-1 of a world of n):
what the engine's CPU tests drive."""
from __future__ import annotations

import ctypes
from typing import Any, Tuple

import numpy as np


def engine_pair(ne: Any, remote: bool = True, **settings: str) -> Tuple[Any, Any]:
    """(rank 0's engine, rank 1's engine) from the _netengine module ``ne``, connected as peers on other nodes
    (``remote``) or on one node, with UCX ``settings`` beside TLS; the caller closes them."""
    a = ne.Engine(0, 2, {"TLS": "tcp,self", **settings})
    b = ne.Engine(1, 2, {"TLS": "tcp,self", **settings})
    addrs = [a.address(), b.address()]
    a.connect(addrs, [False, remote])
    b.connect(addrs, [remote, False])
    return a, b


def engine_world(ne: Any, n: int) -> Tuple[Any, ...]:
    """n engines, ranks 0..n-1 of one world, every pair connected; the caller closes them."""
    engs = [ne.Engine(r, n, {"TLS": "tcp,self"}) for r in range(n)]
    addrs = [e.address() for e in engs]
    for r, e in enumerate(engs):
        e.connect(addrs, [p < r for p in range(n)])
    return tuple(engs)


def held_send(ne: Any, eng: Any, words: Any, done: int) -> Tuple[np.ndarray, np.ndarray]:
    """Stage on rank 0's ``eng`` a step whose send to rank 1 UCX holds until rank 1 receives it (1 MiB:
    rendezvous) and whose 16-byte receive never comes, timing out after 0.3 s: ``words`` (ctypes uint32s) has
    its ready word [0] set and gets ``done`` in its done word [1] when the step is released. Returns the step's
    buffers, to be kept alive while UCX holds the send."""
    big, small = np.ones(1 << 18, np.float32), np.zeros(4, np.float32)
    wa = ctypes.addressof(words)
    words[0] = 1
    eng.staged([(ne.SEND, 1, big.ctypes.data, big.nbytes), (ne.RECV, 1, small.ctypes.data, small.nbytes)],
               wa, 1, wa + 4, done, 0.3, "released step", 0)
    return big, small
