"""Split communicators used concurrently with their parent."""
from __future__ import annotations

import numpy as np

import hpccl


def test_split_even_odd_concurrently():
    world = hpccl.init()
    n, r = world.size, world.rank
    sub = world.split(r % 2, key=-r)  # reversed order inside each half
    members = [q for q in range(n) if q % 2 == r % 2]
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(r)
    for i in range(20):
        a = np.full(1000 + i, r, np.int64)
        b = np.full(1000 + i, r, np.int64)
        sub.all_reduce(a)
        world.all_reduce(b)
        assert np.all(a == sum(members)) and np.all(b == sum(range(n)))
    g = sub.all_gather(np.array([r], np.int64))
    assert sorted(g.reshape(-1).tolist()) == members
    none = world.split(-1 if r == 0 else 0)
    assert (none is None) == (r == 0)
    if none is not None:
        none.destroy()
    sub.destroy()
    world.destroy()


def test_destroyed_subcommunicator_does_not_disturb_parent():
    world = hpccl.init()
    sub = world.split(0, world.rank)
    sub.destroy()
    x = np.ones(10)
    world.all_reduce(x)
    assert np.all(x == world.size)
    world.destroy()
