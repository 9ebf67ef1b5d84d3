"""Python's tools on a GPU communicator: after GPU calls have set up its device engine (and, across nodes,
the network front door), every public callable answers inspect.signature, help(), __doc__, __name__ and
__qualname__ as the class's method does. Collective: run under MPI with the other GPU tests."""
from __future__ import annotations

import inspect
import pydoc


def test_python_tools_see_the_methods_of_a_gpu_communicator():
    import cupy
    import hpccl
    from hpccl.gpu.device import rank_device
    comm = hpccl.Communicator()
    try:
        cupy.cuda.Device(rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())).use()
        x = cupy.ones(1024, dtype=cupy.float32)
        for _ in range(3):  # a repeated call: replayed from its recording where the layout replays
            comm.all_reduce(x)
        comm.all_gather(x[:8])
        comm.synchronize()
        assert float(x[0]) == comm.size ** 3
        cls = type(comm)
        names = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))]
        assert {"all_reduce", "gather", "all_gather_v", "reduce_scatter_v", "shrink"} <= set(names)
        for name in names:
            live, method = getattr(comm, name), getattr(cls, name)
            want = inspect.signature(method.__get__(comm))
            assert inspect.signature(live) == want, (name, inspect.signature(live), want)
            assert live.__doc__ == method.__doc__ and live.__name__ == method.__name__, name
            assert live.__qualname__ == method.__qualname__, name
            text = pydoc.render_doc(live, renderer=pydoc.plaintext)
            assert f"{name}{want}" in text, (name, text[:300])
    finally:
        comm.destroy()
