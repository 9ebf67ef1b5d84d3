"""Observability (issue 13) in every rank: comm.stats() counts what ran; HPCCL_TRACE writes a Chrome trace
per rank that is valid JSON after every call, with the schema the viewers need; hpccl-trace merges the
ranks' files into one timeline; an unwritable HPCCL_TRACE warns and the collectives still run."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import hpccl
from hpccl.cli import trace as trace_cli

WORLD = MPI.COMM_WORLD


def _shared_dir() -> str:
    d = tempfile.mkdtemp(prefix="hpccl-trace-test-") if WORLD.rank == 0 else None
    return WORLD.bcast(d)


def test_stats_count_every_path():
    """Calls, bytes and seconds per collective and algorithm, whichever path ran them (the compiled front
    door, the validating path, the Python algorithms)."""
    comm = hpccl.init()
    n = comm.size
    try:
        for _ in range(5):
            comm.all_reduce(np.ones(4, np.float32))          # front door when the hot path is built
        comm.all_reduce(np.ones(1 << 18, np.float64))        # 2 MiB: above the hot path's limits
        comm.all_gather(np.ones(3, np.int32), np.zeros(3 * n, np.int32))
        comm.broadcast(np.ones(10, np.uint8), 0)
        comm.barrier()
        st = comm.stats()
        ar = st["all_reduce"]
        assert sum(r["calls"] for r in ar.values()) == 6
        assert sum(r["bytes"] for r in ar.values()) == 5 * 16 + (1 << 21)
        assert all(r["seconds"] > 0 for r in ar.values())
        assert all(name.endswith("(host)") for name in ar)
        ag = st["all_gather"]
        assert sum(r["calls"] for r in ag.values()) == 1 and sum(r["bytes"] for r in ag.values()) == 12 * n
        assert sum(r["calls"] for r in st["broadcast"].values()) == 1
        assert sum(r["calls"] for r in st["barrier"].values()) == 1
        assert set(st) == {"all_reduce", "all_gather", "broadcast", "barrier"}
    finally:
        comm.destroy()


def test_trace_schema_and_merge(monkeypatch):
    d = _shared_dir()
    monkeypatch.setenv("HPCCL_TRACE", d)
    comm = hpccl.init()
    n, rank = comm.size, comm.rank
    calls = [("all_reduce", 64), ("all_gather", 8 * n), ("broadcast", 4096), ("all_reduce", 1 << 20)]
    try:
        comm.all_reduce(np.ones(16, np.float32))
        comm.all_gather(np.ones(2, np.float32), np.zeros(2 * n, np.float32))
        comm.broadcast(np.ones(1024, np.float32), 0)
        path = os.path.join(d, f"hpccl-trace-{comm._rec.tag}-rank{rank}.json")
        with open(path) as f:  # valid JSON while the communicator is still running
            mid = json.load(f)
        assert sum(e["ph"] == "X" for e in mid["traceEvents"]) == 3
        comm.all_reduce(np.ones(1 << 18, np.float32))
    finally:
        comm.destroy()
    with open(path) as f:
        doc = json.load(f)
    meta = doc["otherData"]
    assert meta["rank"] == rank and meta["size"] == n and meta["communicator"] == comm._rec.tag
    evs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["args"]["bytes"]) for e in evs] == calls
    seqs = [e["args"]["seq"] for e in evs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for e in evs:
        assert e["pid"] == comm._boot.world_rank and e["tid"] == 0 and e["cat"] == "host"
        assert e["dur"] >= 0 and e["ts"] > 1e15  # microseconds since the epoch
        assert e["args"]["algorithm"] and e["args"]["state"] == "done"
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"process_name", "thread_name"}
    WORLD.Barrier()
    if rank == 0:
        out = os.path.join(d, "merged.json")
        assert trace_cli.main(["merge", d, "-o", out, "--align"]) == 0
        with open(out) as f:
            merged = json.load(f)
        xs = [e for e in merged["traceEvents"] if e["ph"] == "X"]
        assert len(xs) == len(calls) * n
        assert {e["pid"] for e in xs} == set(range(n))
        ts = [e["ts"] for e in xs]
        assert ts == sorted(ts)
        assert len(merged["otherData"]["files"]) == n
        assert trace_cli.main(["summary", d]) == 0
    WORLD.Barrier()
    if rank == 0:
        shutil.rmtree(d)


def test_unwritable_trace_warns_and_runs(monkeypatch, caplog):
    blocker = tempfile.NamedTemporaryFile(prefix="hpccl-not-a-dir-")
    bad = os.path.join(blocker.name, "trace")  # a folder inside a regular file: cannot be made
    monkeypatch.setenv("HPCCL_TRACE", bad)
    with caplog.at_level("WARNING", logger="hpccl"):
        comm = hpccl.init()
    try:
        assert comm._rec.trace is None
        assert any(bad in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        x = np.ones(8, np.float32)
        comm.all_reduce(x)
        assert np.all(x == comm.size)
    finally:
        comm.destroy()
        blocker.close()


def test_trace_turns_fast_paths_off(monkeypatch):
    """While tracing, the compiled front door is closed, so every call is in the file."""
    d = _shared_dir()
    monkeypatch.setenv("HPCCL_TRACE", d)
    comm = hpccl.init()
    try:
        assert comm._front == {}
        x = np.ones(2, np.float32)
        for _ in range(50):
            comm.all_reduce(x)
        with open(comm._rec.trace.path) as f:
            assert sum(e["ph"] == "X" for e in json.load(f)["traceEvents"]) == 50
    finally:
        comm.destroy()
        WORLD.Barrier()
        if WORLD.rank == 0:
            shutil.rmtree(d)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
