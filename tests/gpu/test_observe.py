"""Observability of GPU calls (issue 13): NVTX ranges around every GPU collective (recorded through a
stand-in for the nvtx package, or the real one when installed), HPCCL_TRACE's GPU track timed by CUDA
events, comm.stats() of replayed launches. Collective: run under MPI with the other GPU tests."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
from mpi4py import MPI


class _Recording(types.ModuleType):
    """What hpccl calls of the nvtx package, recorded."""

    def __init__(self) -> None:
        super().__init__("nvtx")
        self.calls = []

    def push_range(self, message=None, domain=None, **kw):
        self.calls.append(("push", message, domain))

    def pop_range(self, domain=None):
        self.calls.append(("pop", None, domain))

    def mark(self, message=None, domain=None, **kw):
        self.calls.append(("mark", message, domain))


def _device():
    import cupy
    from hpccl.device import rank_device
    comm_rank = MPI.COMM_WORLD.rank
    return rank_device(comm_rank, cupy.cuda.runtime.getDeviceCount())


def test_nvtx_ranges_around_gpu_calls(monkeypatch):
    import cupy
    import hpccl
    rec = _Recording()
    monkeypatch.setitem(sys.modules, "nvtx", rec)
    monkeypatch.setenv("HPCCL_NVTX", "1")
    comm = hpccl.Communicator()
    try:
        cupy.cuda.Device(_device()).use()
        x = cupy.ones(1 << 16, dtype=cupy.float32)
        for _ in range(3):
            comm.all_reduce(x)  # repeated: ranges even where a launch would be replayed
        comm.broadcast(x, 0)
        comm.all_reduce(np.ones(4, np.float32))  # host calls get no GPU range
        comm.synchronize()
        pushes = [m for k, m, d in rec.calls if k == "push"]
        assert len(pushes) == 4 and all(d == "hpccl" for _, _, d in rec.calls)
        assert pushes[0].startswith("hpccl all_reduce #") and "262144 B" in pushes[0]
        assert pushes[3].startswith("hpccl broadcast #")
        assert sum(k == "pop" for k, _, _ in rec.calls) == 4
        marks = [m for k, m, _ in rec.calls if k == "mark"]
        assert len(marks) == 4 and all(m.startswith("algorithm ") for m in marks)
        assert float(x[0]) == comm.size ** 3
    finally:
        comm.destroy()


def test_trace_has_gpu_track(monkeypatch, tmp_path_factory):
    import cupy
    import hpccl
    d = MPI.COMM_WORLD.bcast(str(tmp_path_factory.mktemp("trace")) if MPI.COMM_WORLD.rank == 0 else None)
    monkeypatch.setenv("HPCCL_TRACE", d)
    monkeypatch.setenv("HPCCL_NVTX", "0")
    comm = hpccl.Communicator()
    try:
        cupy.cuda.Device(_device()).use()
        s = cupy.cuda.Stream(non_blocking=True)
        x = cupy.ones(1 << 20, dtype=cupy.float32)
        for _ in range(4):
            comm.all_reduce(x, stream=s)
        comm.all_gather(x[:1000], cupy.zeros(1000 * comm.size, dtype=cupy.float32), stream=s)
        comm.synchronize()
        path = comm._rec.trace.path
    finally:
        comm.destroy()
    with open(path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    host = [e for e in evs if e["tid"] == 0]
    gpu = [e for e in evs if e["tid"] == 1]
    assert [e["name"] for e in host] == ["all_reduce"] * 4 + ["all_gather"]
    assert all(e["cat"] == "cuda" for e in host) and all(e["args"]["state"] == "enqueued" for e in host)
    assert [e["name"] for e in gpu] == ["all_reduce"] * 4 + ["all_gather"]
    assert all(e["dur"] > 0 for e in gpu)
    # a call's GPU time starts after its host call began (the reference event ties the two clocks)
    for h, g in zip(host, gpu):
        assert g["args"]["seq"] == h["args"]["seq"]
        assert g["ts"] >= h["ts"] - 1000.0, (h, g)
    MPI.COMM_WORLD.Barrier()


def test_stats_of_replayed_gpu_calls():
    import cupy
    import hpccl
    comm = hpccl.Communicator()
    try:
        cupy.cuda.Device(_device()).use()
        x = cupy.ones(1000, dtype=cupy.float32)
        for _ in range(10):
            comm.all_reduce(x)
        comm.synchronize()
        ar = comm.stats()["all_reduce"]
        assert sum(r["calls"] for r in ar.values()) == 10
        assert sum(r["bytes"] for r in ar.values()) == 10 * 4000
        assert all(k.endswith("(cuda)") and not k.startswith("-") for k in ar), ar
    finally:
        comm.destroy()
