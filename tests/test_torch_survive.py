"""torch goes on after a rank fails: DDP on the "hpccl" backend, 3 ranks started as plain processes over a
FileStore (tests/scripts/torch_survive.py, CPU tensors). A rank SIGKILLs or SIGSTOPs itself mid-training;
every survivor catches the error the training step raised, names the failed rank from it, destroys the
process group, builds a new one over the survivors under a fresh store prefix, re-wraps the model in DDP
from the state after the last completed step and trains on: the survivors' parameters are identical, bit for
bit, and equal a single-process reference trained on the same data for the same steps. No process and no
/dev/shm file is left."""
from __future__ import annotations

import importlib.util
import os
import time

import pytest

from mpirun import results, shm_snapshot, start_plain

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (scripts/setup.sh installs the CPU build)")

N, KILL_AT = 3, 5


def _alive(store_dir) -> list:
    """Processes still running with this run's STORE_DIR in their environment."""
    mark, left = f"STORE_DIR={store_dir}".encode(), []
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    left.append(int(pid))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return left


@pytest.mark.parametrize("mode,victim,native", [("kill", 2, "1"), ("kill", 0, "1"), ("kill", 1, "0"),
                                                ("stop", 1, "1")],
                         ids=["kill-last", "kill-rank0", "kill-python-only", "stop"])
def test_ddp_goes_on_over_the_survivors(mode, victim, native, tmp_path):
    """kill: every survivor names the victim within 3 s; stop (HPCCL_TIMEOUT=3): within HPCCL_TIMEOUT + 3 s,
    as the rank that never arrived or as the rank a timed-out peer's abort names. Then DDP goes on over the
    two survivors (ranks renumbered in order), from the step the victim never finished."""
    timeout = 3.0 if mode == "stop" else 30.0
    hpccl_shm = {f for f in shm_snapshot() if "hpccl" in f}
    env = {"VICTIM": str(victim), "MODE": mode, "KILL_AT": str(KILL_AT), "STEPS_AFTER": "5", "BUF": "cpu",
           "HPCCL_TIMEOUT": str(timeout), "HPCCL_TORCH_NATIVE": native}
    procs = start_plain(N, "tests/scripts/torch_survive.py", tmp_path, env)
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=90)[0])
        except Exception:  # noqa: BLE001 - a hang: end every rank (each by its own pid), then fail below
            for q in procs:
                if q.poll() is None:
                    q.kill()
            outs.append(p.communicate()[0] + "\n(killed by the test: it hung)")
    every = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{o[-3000:]}" for r, (p, o) in enumerate(zip(procs, outs)))
    mark = tmp_path / "victim_at"
    assert mark.exists(), "the victim never reached its kill point:\n" + every
    at = float(mark.read_text())
    assert procs[victim].returncode == -9, every  # killed: by itself, or (stopped) by the lowest survivor
    survivors = [r for r in range(N) if r != victim]
    rows = {row["rank"]: row for r in survivors for row in results(outs[r])}
    assert sorted(rows) == survivors and all(procs[r].returncode == 0 for r in survivors), every
    for r, row in rows.items():
        if mode == "kill":
            assert row["error"] == "HpcclRemoteError" and row["failed"] == victim, (r, row)
        else:
            assert row["error"] in ("HpcclTimeoutError", "HpcclRemoteError"), (r, row)
        assert row["named"] and row["gpu_ok"] and row["phase"] == "backward", (r, row)  # DDP's all_reduce raised
        assert row["at"] - at < (timeout + 3.0 if mode == "stop" else 3.0), (r, row, row["at"] - at)
        assert row["after_shrink"] == ["ddp_steps"], (r, row)
        assert all(row["checks"].values()), (r, row)  # identical before and after the re-wrap, at the end, = reference
        assert row["new_size"] == N - 1 and row["new_rank"] == survivors.index(r), (r, row)
        assert row["resumed_from"] == KILL_AT and row["steps_run"] == KILL_AT + 5, (r, row)
    assert len({row["params_sha1"] for row in rows.values()}) == 1, rows  # bit for bit, as each survivor printed
    deadline = time.monotonic() + 5
    while _alive(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(tmp_path) == []
    assert {f for f in shm_snapshot() if "hpccl" in f} - hpccl_shm == set()
