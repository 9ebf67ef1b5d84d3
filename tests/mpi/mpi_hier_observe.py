"""hier, observed (issue 20), on 2 emulated nodes x 2 ranks (HPCCL_NODE_ID=split:2, 4 ranks): a user's call
is one call of the communicator it was made on (one flight-recorder entry, one trace event, one stats count,
one sequence number), and the steps it runs on the sub-communicators 'intra' and 'inter' are recorded
inside it (steps of the record, child events of the trace event, step rows of the stats row), never as
calls of their own; an error met in a step names the user's call and its sequence number alone."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import hpccl
from hpccl.observe import recorder

WORLD = MPI.COMM_WORLD
HIER = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")

pytestmark = pytest.mark.skipif(WORLD.size != 4 or os.environ.get("HPCCL_NODE_ID") != "split:2",
                                reason="needs 2 emulated nodes x 2 ranks (4 ranks, HPCCL_NODE_ID=split:2)")


def _shared_dir() -> str:
    d = tempfile.mkdtemp(prefix="hpccl-hier-observe-") if WORLD.rank == 0 else None
    return WORLD.bcast(d)


def _hier_comm() -> hpccl.Communicator:
    comm = hpccl.init()
    assert comm.num_nodes == 2 and comm.local_size == 2
    for coll in HIER:
        comm._planner.force(coll, "hier")
    return comm


def _calls(comm: hpccl.Communicator, n: int) -> list:
    """n user calls of each hier collective (and one all_reduce of a size the node does not split evenly,
    whose steps are reduces and broadcasts); [(collective, bytes)] in call order. Results checked."""
    size, made = comm.size, []
    for _ in range(n):
        x = np.full(64, comm.rank + 1, np.float32)
        comm.all_reduce(x)
        assert np.all(x == 10)
        g = comm.all_gather(np.full(3, comm.rank, np.int32), np.zeros(3 * size, np.int32))
        assert list(g[::3]) == list(range(size))
        out = comm.reduce_scatter(np.ones(4 * size, np.float64), np.zeros(4, np.float64))
        assert np.all(out == size)
        b = np.full(16, comm.rank, np.int64)
        comm.broadcast(b, root=1)
        assert np.all(b == 1)
        r = np.ones(8, np.float32)
        comm.reduce(r, root=2)
        assert comm.rank != 2 or np.all(r == size)
        made += [("all_reduce", 256), ("all_gather", 12 * size), ("reduce_scatter", 32 * size),
                 ("broadcast", 128), ("reduce", 32)]
    odd = np.ones(7, np.float32)
    comm.all_reduce(odd)
    assert np.all(odd == size)
    return made + [("all_reduce", 28)]


def test_each_user_call_is_one_traced_call(monkeypatch):
    d = _shared_dir()
    monkeypatch.setenv("HPCCL_TRACE", d)
    comm = _hier_comm()
    n = 2
    try:
        made = _calls(comm, n)
        total = len(made)
        assert comm._seq == total  # one sequence number per user call
        assert all(sub._rec.trace is None and sub._rec.calls() == [] for sub in comm._sub.values())
        # flight recorder: one entry per call, its steps inside, numbered from 1, all done
        recs = comm._rec.calls()
        assert [(r["collective"], r["bytes"]) for r in recs] == made
        assert [r["seq"] for r in recs] == list(range(1, total + 1))
        for r in recs:
            assert r["algorithm"] == "hier" and r["state"] == "done", r
            assert r["steps"] and [s["step"] for s in r["steps"]] == list(range(1, len(r["steps"]) + 1))
            assert {s["communicator"] for s in r["steps"]} <= {"intra", "inter"}
            assert all(s["state"] == "done" and s["algorithm"] for s in r["steps"]), r["steps"]
            assert all(r["start"] <= s["start"] <= s["end"] <= r["end"] for s in r["steps"]), r
        assert [s["collective"] for s in recs[0]["steps"]] == ["reduce_scatter", "all_reduce", "all_gather"]
        # stats: n calls per collective (n + 1 all_reduce), all under hier; the steps counted under that row
        st = comm.stats()
        assert set(st) == set(HIER)
        for coll in HIER:
            assert list(st[coll]) == ["hier (host)"], st[coll]
            row = st[coll]["hier (host)"]
            assert row["calls"] == n + (coll == "all_reduce"), (coll, row)
            assert row["bytes"] == sum(b for c, b in made if c == coll)
            want = sum(len(r["steps"]) for r in recs if r["collective"] == coll)
            assert sum(s["calls"] for s in row["steps"].values()) == want, row["steps"]
        tag, path = comm._rec.tag, comm._rec.trace.path
    finally:
        comm.destroy()
    # the trace: one top-level event per call, its steps child events inside it (same track, its seq)
    with open(path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    top = [e for e in evs if e["cat"] != "step"]
    steps = [e for e in evs if e["cat"] == "step"]
    assert [(e["name"], e["args"]["bytes"]) for e in top] == made
    assert [e["args"]["seq"] for e in top] == list(range(1, total + 1))
    assert [(e["args"]["seq"], e["args"]["step"], e["name"]) for e in steps] == \
        [(r["seq"], s["step"], f"{s['communicator']} {s['collective']}") for r in recs for s in r["steps"]]
    by_seq = {e["args"]["seq"]: e for e in top}
    for s in steps:
        p = by_seq[s["args"]["seq"]]
        assert s["tid"] == p["tid"] == 0 and s["pid"] == p["pid"] and s["args"]["of"] == p["name"], (p, s)
        assert p["ts"] <= s["ts"] and s["ts"] + s["dur"] <= p["ts"] + p["dur"] + 1e-3, (p, s)
    WORLD.Barrier()
    if WORLD.rank == 0:  # the sub-communicators wrote no files: one per rank, of the user's communicator
        assert sorted(os.listdir(d)) == [f"hpccl-trace-{tag}-rank{r}.json" for r in range(WORLD.size)]
        shutil.rmtree(d)
    WORLD.Barrier()


def _step_error(comm: hpccl.Communicator, exc: hpccl.HpcclError, seq: int) -> None:
    """The error names the user's call and its sequence number, and no other number of a call."""
    assert exc.collective == "all_reduce" and exc.seq == seq, (exc.collective, exc.seq, str(exc))
    assert re.findall(r"#\d+", str(exc)) == [f"#{seq}"], str(exc)
    rec = comm._rec.calls()
    assert [r["seq"] for r in rec] == list(range(1, seq + 1))  # one entry per user call, the failed one last
    last = rec[-1]
    assert last["collective"] == "all_reduce" and last["state"] == f"failed: {type(exc).__name__}", last
    if "hierarchical step" in str(exc):  # the step it names is the one the record shows failed
        k = int(re.search(r"hierarchical step (\d+)", str(exc)).group(1))
        assert last["steps"][k - 1]["state"].startswith("failed"), last["steps"]


def test_error_in_a_step_names_the_users_call(monkeypatch):
    """A rank fails between calls; the others, inside the next hier call, get HpcclRemoteError naming
    all_reduce #3 (the user's third call), not a step's own count; the flight recorder's dump holds the
    user's communicator only, the failed call last with its steps."""
    d = _shared_dir()
    monkeypatch.setenv("HPCCL_DUMP_DIR", d)
    comm = _hier_comm()
    tag = comm._rec.tag
    try:
        x = np.ones(64, np.float32)
        comm.all_reduce(x)
        comm.all_reduce(x)
        if comm.rank == 3:
            comm.abort()
        else:
            with pytest.raises(hpccl.HpcclRemoteError) as info:
                comm.all_reduce(x)
            assert "rank 3 failed" in str(info.value), str(info.value)
            _step_error(comm, info.value, 3)
    finally:
        comm.destroy()
    WORLD.Barrier()
    if WORLD.rank == 0:
        assert sorted(os.listdir(d)) == [f"hpccl-{tag}-rank{r}.json" for r in range(WORLD.size)]
        with open(os.path.join(d, f"hpccl-{tag}-rank0.json")) as f:
            calls = json.load(f)["calls"]
        assert [c["seq"] for c in calls] == [1, 2, 3] and calls[-1]["steps"], calls
        text = "\n".join(recorder.analyze(d))
        assert f"communicator {tag}: 4 of 4 ranks dumped" in text and "in step " in text, text
        shutil.rmtree(d)
    WORLD.Barrier()


def test_timeout_in_a_step_names_the_users_call(monkeypatch):
    """Rank 3 never comes to the third call (it waits in an MPI barrier the others reach once they have
    failed): its peers time out (or are told another did) inside a step, and the error names all_reduce #3
    alone, and rank 3 as missing. The timeout (3 s) leaves room for the first call's set-up (the
    sub-communicators and their network wire-up) on a loaded machine, where 0.2 s failed call #1."""
    monkeypatch.setenv("HPCCL_TIMEOUT", "3")
    comm = _hier_comm()
    try:
        x = np.ones(64, np.float32)
        comm.all_reduce(x)
        comm.all_reduce(x)
        if comm.rank != 3:
            with pytest.raises((hpccl.HpcclTimeoutError, hpccl.HpcclRemoteError)) as info:
                comm.all_reduce(x)
            _step_error(comm, info.value, 3)
            if isinstance(info.value, hpccl.HpcclTimeoutError):
                assert info.value.missing == [3], str(info.value)
    finally:
        WORLD.Barrier()  # rank 3 waits here, outside the call, until the others have failed
        comm.destroy()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
