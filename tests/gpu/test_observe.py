"""Observability of GPU calls (issue 13): NVTX ranges around every GPU collective (recorded through a
stand-in for the nvtx package, or the real one when installed), HPCCL_TRACE's GPU track timed by CUDA
events, comm.stats() of replayed launches. Collective: run under MPI with the other GPU tests, on any
layout: one node, or emulated nodes (HPCCL_NODE_ID=split:2), where hier's steps on its sub-communicators
must nest inside the user's call (issue 20), never count as calls of their own."""
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


def _ranges(calls):
    """[(message, domain, depth in 'hpccl', [(step message, [its marks])], [marks])] for every range pushed
    in the domain 'hpccl', checking the nesting rule on the way: ranges of 'hpccl' never nest (one per user
    call), ranges of 'hpccl.steps' (hier's steps) open only inside one of 'hpccl', every pop matches a push
    of its own domain, and marks sit inside a range of their domain."""
    out, stack = [], []  # stack: [domain, entry]
    for kind, msg, dom in calls:
        assert dom in ("hpccl", "hpccl.steps"), (kind, msg, dom)
        if kind == "push":
            if dom == "hpccl":
                assert not stack, f"a range of 'hpccl' inside another: {msg} in {stack}"
                entry = [msg, [], []]
                out.append(entry)
            else:
                assert stack and stack[0][0] == "hpccl", f"a step outside a user's call: {msg}"
                entry = [msg, []]
                stack[0][1][1].append(entry)
            stack.append([dom, entry])
        elif kind == "pop":
            assert stack and stack[-1][0] == dom, (kind, dom, stack)
            stack.pop()
        else:
            assert stack and stack[-1][0] == dom, f"a mark of {dom} outside a range of it: {msg}"
            stack[-1][1][-1].append(msg)
    assert not stack, stack
    return out


def _device():
    import cupy
    from hpccl.gpu.device import rank_device
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
        ranges = _ranges(rec.calls)  # exactly one top-level range per user call, on any layout
        assert [m.split(" #")[0] for m, _, _ in ranges] == ["hpccl all_reduce"] * 3 + ["hpccl broadcast"]
        assert all("262144 B" in m for m, _, _ in ranges)
        assert [int(m.split("#")[1].split()[0]) for m, _, _ in ranges] == [1, 2, 3, 4]
        for msg, steps, marks in ranges:
            assert len(marks) == 1 and marks[0].startswith("algorithm "), (msg, marks)
            if marks[0] == "algorithm hier":  # its steps: nested, named after the user's call
                assert steps, msg
                seq = msg.split()[2]
                for k, (smsg, smarks) in enumerate(steps, 1):
                    assert smsg.startswith(f"hpccl step {k} of {msg.split()[1]} {seq}: "), smsg
                    assert smsg.split(": ")[1].split()[0] in ("intra", "inter"), smsg
                    assert len(smarks) == 1 and smarks[0].startswith("algorithm "), (smsg, smarks)
            else:
                assert not steps, (msg, steps)
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
    host = [e for e in evs if e["tid"] == 0 and e["cat"] != "step"]
    steps = [e for e in evs if e["cat"] == "step"]  # hier's steps (several nodes): inside their call's event
    gpu = [e for e in evs if e["tid"] == 1]
    by_seq = {e["args"]["seq"]: e for e in host}
    for s in steps:
        h = by_seq[s["args"]["seq"]]
        assert h["args"]["algorithm"] == "hier" and s["tid"] == 0 and s["args"]["of"] == h["name"], (h, s)
        assert h["ts"] <= s["ts"] and s["ts"] + s["dur"] <= h["ts"] + h["dur"] + 1e-3, (h, s)
    assert all(any(s["args"]["seq"] == h["args"]["seq"] for s in steps)
               for h in host if h["args"]["algorithm"] == "hier")
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
