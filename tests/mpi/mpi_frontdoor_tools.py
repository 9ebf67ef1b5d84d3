"""The C front doors as attributes of a communicator (hpccl/csrc/_frontdoor.c, installed by
hpccl/host/hotcalls.py): each collective's door shadows its method, a communicator made with
HPCCL_HOST_DOOR=0 has none, and Python's tools (inspect.signature, help(), __doc__, __wrapped__) see through
every door to the method. Collective: run under mpiexec at 2 or more ranks of a node."""
from __future__ import annotations

import numpy as np
import pytest

import hpccl

COLLS = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"]


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    if c.size < 2:
        c.destroy()
        pytest.skip("the hot path and its front doors serve 2 or more ranks of a node (this run has 1)")
    yield c
    c.destroy()


def test_c_front_doors_shadow_the_methods(comm, monkeypatch):
    """Each collective's C front door is an attribute of the communicator (so comm.broadcast is it, not the
    method); a communicator made with HPCCL_HOST_DOOR=0 has none and calls the methods."""
    for coll in COLLS:
        door = comm.__dict__.get(coll)
        assert type(door).__name__ == "FrontDoor" and door.collective == coll, (coll, door)
        assert getattr(comm, coll) is door
    monkeypatch.setenv("HPCCL_HOST_DOOR", "0")
    sub = comm.split(0, comm.rank)
    try:
        assert not any(c in sub.__dict__ for c in COLLS), [c for c in COLLS if c in sub.__dict__]
        x = np.full(4, comm.rank + 1, np.float32)
        assert sub.all_reduce(x) is x and np.all(x == comm.size * (comm.size + 1) // 2)
    finally:
        sub.destroy()


def test_python_tools_see_the_methods_through_the_doors(comm):
    """Every public callable of a live communicator, front door or not, answers inspect.signature, help(),
    __doc__, __name__, __qualname__ and __wrapped__ as the class's method does (a door's __wrapped__ is the
    bound method), and pydoc renders the method's signature and text."""
    import inspect
    import pydoc
    cls = type(comm)
    names = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))]
    assert set(COLLS) <= set(names)
    for name in names:
        live, method = getattr(comm, name), getattr(cls, name)
        want = inspect.signature(method.__get__(comm))
        assert inspect.signature(live) == want, (name, inspect.signature(live), want)
        assert live.__doc__ == method.__doc__ and live.__name__ == method.__name__, name
        assert live.__qualname__ == method.__qualname__, name
        assert inspect.isroutine(live), name
        if name in COLLS:
            assert live.__wrapped__ == method.__get__(comm), name
        text = pydoc.render_doc(live, renderer=pydoc.plaintext)
        assert f"{name}{want}" in text and method.__doc__.splitlines()[0].strip() in text, (name, text[:300])
