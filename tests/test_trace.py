"""HPCCL_TRACE survives a crash: a rank killed with SIGKILL in the middle of its calls leaves a trace file
that is valid JSON holding every call it completed (the file is rewritten to be whole after each one)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import os, signal, numpy as np, hpccl
c = hpccl.init()
x = np.ones(4)
for i in range(30):
    c.all_reduce(x)
c.broadcast(np.ones(1000, np.uint8), 0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_trace_of_a_killed_rank_is_valid_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "MPI", "HYDRA", "OMPI", "PMIX"))}
    env["HPCCL_TRACE"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    shm = Path("/dev/shm")
    before = set(shm.iterdir()) if shm.is_dir() else set()
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    _, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    # the killed process could not clean up: remove MPICH's singleton segment it left (named after its
    # pid); hpccl itself leaves nothing for one rank
    left = (set(shm.iterdir()) if shm.is_dir() else set()) - before
    assert not [p for p in left if "hpccl" in p.name], left
    for p in left:
        if p.name.startswith(f"mpich_shm_{child.pid:x}_"):
            p.unlink(missing_ok=True)
    files = list(tmp_path.glob("hpccl-trace-*-rank0.json"))
    assert len(files) == 1, list(tmp_path.iterdir())
    doc = json.loads(files[0].read_text())
    calls = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in calls] == ["all_reduce"] * 30 + ["broadcast"]
    assert calls[-1]["args"]["bytes"] == 1000 and calls[-1]["args"]["state"] == "done"


def test_nvtx_switch(monkeypatch, caplog):
    """HPCCL_NVTX: auto uses the nvtx package when it imports and an NVTX tool is set to load
    (NVTX_INJECTION64_PATH, as Nsight Systems sets it), 1 whenever it imports and warns when it is missing,
    0 is off."""
    import types

    from hpccl.observe import nvtx as hnvtx
    fake = types.ModuleType("nvtx")
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    monkeypatch.delenv("NVTX_INJECTION32_PATH", raising=False)
    for mode, want in (("auto", None), ("1", fake), ("0", None)):  # no tool: auto leaves replays on
        monkeypatch.setenv("HPCCL_NVTX", mode)
        assert hnvtx.ranges() is want, mode
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight-systems/libToolsInjection64.so")
    for mode, want in (("auto", fake), ("1", fake), ("0", None)):
        monkeypatch.setenv("HPCCL_NVTX", mode)
        assert hnvtx.ranges() is want, mode
    monkeypatch.setitem(sys.modules, "nvtx", None)  # as if not installed: import raises ImportError
    monkeypatch.setenv("HPCCL_NVTX", "auto")
    assert hnvtx.ranges() is None
    monkeypatch.setenv("HPCCL_NVTX", "1")
    with caplog.at_level("WARNING", logger="hpccl"):
        assert hnvtx.ranges() is None
    assert any("nvtx package is not installed" in r.getMessage() for r in caplog.records)


def test_nvtx_calls_match_the_package():
    """The calls hpccl makes (comm.py: push_range/pop_range; recorder.py: mark) are the nvtx package's
    own API: made here against the real package (installed with the test extra), where, with no profiler
    attached, they record nothing and must not raise; a hier step's range nests, in its own domain, inside
    the user's call's."""
    import nvtx
    nvtx.push_range("hpccl all_reduce #1 8 B", domain="hpccl")
    nvtx.mark("algorithm hier", domain="hpccl")
    nvtx.push_range("hpccl step 1 of all_reduce #1: intra reduce_scatter 8 B", domain="hpccl.steps")
    nvtx.mark("algorithm oneshot", domain="hpccl.steps")
    nvtx.pop_range(domain="hpccl.steps")
    nvtx.pop_range(domain="hpccl")
    src = (ROOT / "hpccl" / "core" / "comm.py").read_text() + (ROOT / "hpccl" / "observe" / "recorder.py").read_text()
    assert "push_range(self._rec.label(rec), domain=self._rec.domain)" in src
    assert "pop_range(domain=self._rec.domain)" in src
    assert 'mark(f"algorithm {name}", domain=DOMAIN)' in src and 'mark(f"algorithm {name}", domain=STEP_DOMAIN)' in src
    from hpccl.observe import recorder
    assert (recorder.DOMAIN, recorder.STEP_DOMAIN) == ("hpccl", "hpccl.steps")


class _Ranges:
    """A stand-in for the nvtx package that records marks (the recorders make them; comm.py the ranges)."""

    def __init__(self):
        self.calls = []

    def mark(self, message=None, domain=None, **kw):
        self.calls.append((message, domain))


def test_steps_nest_in_the_users_call(tmp_path, monkeypatch, capsys):
    """One process, the recorders alone (what comm.py drives): a StepRecorder (a hier sub-communicator's)
    adds each of its calls to the call its parent is running, and nothing of its own: one flight-recorder
    entry, one top-level trace event with the steps as child events inside it, one stats count with step
    rows under it, NVTX labels and marks of the steps in their own domain."""
    from hpccl.observe.recorder import Recorder, StepRecorder
    monkeypatch.setenv("HPCCL_TRACE", str(tmp_path))
    top = Recorder("t0", 0, 4, 0)
    intra = StepRecorder(top, "intra", "t1", 0, 2, 0)
    inter = StepRecorder(top, "inter", "t2", 0, 2, 0)
    assert intra.trace is None and inter.trace is None and list(tmp_path.iterdir()) == [Path(top.trace.path)]
    top.nvtx = intra.nvtx = inter.nvtx = marks = _Ranges()
    rec = top.start(1, "all_reduce", 64, "cuda")
    assert top.label(rec) == "hpccl all_reduce #1 64 B" and top.domain == "hpccl"
    top.algo("hier")
    for sub, coll, nbytes in ((intra, "reduce_scatter", 64), (inter, "all_reduce", 32), (intra, "all_gather", 64)):
        step = sub.start(7, coll, nbytes, "cuda")  # the sub-communicator's own count (7) stays internal
        assert sub.domain == "hpccl.steps"
        assert sub.name(coll, 7) == f"all_reduce #1, step {step[0]} ({sub.where} {coll})"
        sub.algo("oneshot" if sub is intra else "ring")
        sub.end(step, "enqueued")
    assert intra.label(step) == "hpccl step 3 of all_reduce #1: intra all_gather 64 B"
    assert top.step() == "step 3 (intra all_gather)"
    assert intra.at() == ("all_reduce", 1, "step 3 (intra all_gather)") and top.at() is None
    # a network step's error raised later (synchronize) is named after the user's call, from at()
    from hpccl.runtime.failures import in_call as _in_call
    from hpccl.errors import HpcclRemoteError, HpcclTimeoutError
    late = HpcclTimeoutError("all_reduce", 7, [3], 1.0)
    late.in_call = inter.at()
    named = _in_call(late)
    assert (named.collective, named.seq, named.missing) == ("all_reduce", 1, [3])
    assert re.findall(r"#\d+", str(named)) == ["#1"] and "step 2 (inter all_reduce)" in str(named), str(named)
    late = HpcclRemoteError.aborted("all_reduce", 7, 2, [2])
    late.in_call = inter.at()
    assert re.findall(r"#\d+", str(_in_call(late))) == ["#1"] and _in_call(late).rank == 2
    top.end(rec, "enqueued")
    assert marks.calls == [("algorithm hier", "hpccl"), ("algorithm oneshot", "hpccl.steps"),
                           ("algorithm ring", "hpccl.steps"), ("algorithm oneshot", "hpccl.steps")]
    calls = top.calls()
    assert len(calls) == 1 and intra.calls() == [] and intra.dump("x") is None
    assert [(s["step"], s["communicator"], s["collective"], s["algorithm"], s["state"]) for s in calls[0]["steps"]] == \
        [(1, "intra", "reduce_scatter", "oneshot", "enqueued"), (2, "inter", "all_reduce", "ring", "enqueued"),
         (3, "intra", "all_gather", "oneshot", "enqueued")]
    st = top.stats.snapshot()
    assert list(st) == ["all_reduce"] and st["all_reduce"]["hier (cuda)"]["calls"] == 1
    assert {k: v["calls"] for k, v in st["all_reduce"]["hier (cuda)"]["steps"].items()} == \
        {"inter all_reduce (ring)": 1, "intra all_gather (oneshot)": 1, "intra reduce_scatter (oneshot)": 1}
    assert any(line.strip().startswith("inter all_reduce (ring)") for line in top.stats.lines())
    assert intra.stats.snapshot() == {} and inter.stats.snapshot() == {}
    top.trace.close()
    evs = [e for e in json.loads(Path(top.trace.path).read_text())["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["cat"], e["args"]["seq"]) for e in evs] == [
        ("all_reduce", "cuda", 1), ("intra reduce_scatter", "step", 1), ("inter all_reduce", "step", 1),
        ("intra all_gather", "step", 1)]
    p = evs[0]
    for e in evs[1:]:
        assert e["tid"] == p["tid"] and p["ts"] <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"] + 1e-3
        assert e["args"]["of"] == "all_reduce" and e["args"]["memory"] == "cuda"
    assert [e["args"]["step"] for e in evs[1:]] == [1, 2, 3]
    # hpccl-trace summary counts the call once and lists its steps under it, as steps
    from hpccl.cli import trace as trace_cli
    capsys.readouterr()
    assert trace_cli.main(["summary", top.trace.path]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows[0][:4] == ["all_reduce", "hier", "host", "1"] and rows[0][4] == "calls", rows
    assert sorted((r[0], r[1], r[-3]) for r in rows[1:]) == [("inter", "all_reduce", "steps"),
                                                          ("intra", "all_gather", "steps"),
                                                          ("intra", "reduce_scatter", "steps")], rows
