"""Ranks killed or stopped with calls in flight, on host buffers (the GPU machine runs the same campaign on GPU
buffers under MPS: docs/perf/inflight/). bench/inflight_campaign.py checks each case: every survivor raised an
HpcclError naming the victim in time, shrink to the survivors and every collective on the new communicator
worked (results checked), a bystander job beside it saw no error, no process and nothing in /dev/shm left."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _campaign(*args: str) -> dict:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "inflight_campaign.py"), "--buf", "numpy",
                          *args], capture_output=True, text=True, timeout=400)
    lines = out.stdout.splitlines()
    summary = [json.loads(ln[8:]) for ln in lines if ln.startswith("SUMMARY ")]
    failed = [ln for ln in lines if ln.startswith("FAIL ")]
    assert summary, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.returncode == 0 and not failed, "\n".join(failed) or out.stdout[-3000:]
    return summary[0]


def test_survivors_go_on_after_a_kill_with_calls_in_flight():
    """The issue's table at three positions: split:1 x 3 (victim 1), split:2 x 4 (victim 3), one node x 4
    (victim 1); all_reduce 256 KiB, synchronised every 50 calls, the victim killed at call 300."""
    s = _campaign("--table", "--pick", "3,8,16")
    assert s["cases"] == s["passed"] == 3 and s["lost_contexts"] == 0 and s["bystander_errors"] == 0, s
    assert s["max_latency_s"] is not None and s["max_latency_s"] < 3.0, s


def test_random_in_flight_failures():
    """Random layout, collective (or DDP training steps on the torch backend), size, dtype, depth and kill or
    stop (seed 3: 5 cases, two of them DDP, one a stop)."""
    s = _campaign("--cases", "5", "--seed", "3")
    assert s["cases"] == s["passed"] == 5 and s["wrong_results"] == 0 and s["hangs"] == 0, s
