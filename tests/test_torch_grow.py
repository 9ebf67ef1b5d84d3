"""The torch recipe for elastic membership (docs/TORCH.md, "Growing the group back"): DDP on the "hpccl"
backend, 3 ranks as plain processes over a FileStore (tests/scripts/torch_grow.py, CPU tensors). Rank 1
SIGKILLs itself at step 3; the survivors name it, re-make the group over the two of them and train on; a
fresh process, started once rank 1 is gone, asks to join through the store; the members admit it by step 6,
re-make the group over the three, hand it rank 0's parameters, optimizer state and step, and all train to step
10. The state is identical on every rank after the grow, and the final parameters are identical everywhere
and equal a one-process reference. No process and no /dev/shm file is left. Also hpccl's own grow and join
over a torch FileStore."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from mpirun import ROOT, results, shm_snapshot

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (scripts/setup.sh installs the CPU build)")

N, VICTIM, KILL_AT, GROW_AT, STEPS = 3, 1, 3, 6, 10


def test_ddp_grows_back_after_a_kill(tmp_path):
    shm_before = {f for f in shm_snapshot() if "hpccl" in f}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PMIX", "MPI_", "HYDRA"))}
    env.update(STORE_DIR=str(tmp_path), SIZE=str(N), VICTIM=str(VICTIM), KILL_AT=str(KILL_AT), GROW_AT=str(GROW_AT),
               STEPS=str(STEPS), HPCCL_TIMEOUT="30", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    script = str(ROOT / "tests" / "scripts" / "torch_grow.py")

    def start(**extra):
        return subprocess.Popen([sys.executable, script], cwd=ROOT, env=dict(env, **extra), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    procs = [start(ROLE="old", RANK=str(r)) for r in range(N)]
    try:
        procs[VICTIM].wait(timeout=90)
    except subprocess.TimeoutExpired:
        pass
    procs.append(start(ROLE="new"))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:  # a hang: end every process (each by its own pid), then fail below
            for q in procs:
                if q.poll() is None:
                    q.kill()
            outs.append(p.communicate()[0] + "\n(killed by the test: it hung)")
    every = "\n".join(f"--- process {i} (exit {p.returncode}):\n{o[-3000:]}"
                      for i, (p, o) in enumerate(zip(procs, outs)))
    assert procs[VICTIM].returncode == -9 and (tmp_path / "victim_at").exists(), every
    rows = {}
    for i in [r for r in range(N) if r != VICTIM] + [N]:
        (row,) = results(outs[i])
        assert procs[i].returncode == 0 and "train_error" not in row, every
        rows[i] = row
    survivors = [r for r in range(N) if r != VICTIM]
    for r in survivors:
        row = rows[r]
        assert row["error"] == "HpcclRemoteError" and row["failed"] == [str(VICTIM)], row
        assert row["shrunk_size"] == N - 1 and row["shrunk_rank"] == survivors.index(r), row
        assert row["resumed_from"] == KILL_AT, row
    for i, row in rows.items():
        assert row["grown_size"] == N and row["grown_rank"] == (survivors.index(i) if i < N else N - 1), row
        assert KILL_AT < row["grown_at"] <= GROW_AT and row["steps_run"] == STEPS, row
        assert row["checks"] == {"grown_same": True, "final_same": True, "matches_reference": True}, row
    assert len({row["grown_at"] for row in rows.values()}) == 1, rows
    assert len({row["params_sha1"] for row in rows.values()}) == 1, rows
    assert {f for f in shm_snapshot() if "hpccl" in f} - shm_before == set()


def test_grow_over_a_torch_store(tmp_path):
    """hpccl's own grow and join over a torch Store (a FileStore): one plain process grows by one; the new
    process is rank 1; every call right on the grown communicator and on the old one."""
    sys.path.insert(0, str(ROOT / "tests" / "scripts"))
    from grow_drive import every_at, finish, plain_env, start
    env = plain_env({"STORE_DIR": str(tmp_path), "STORE_KIND": "torch", "MODE": "grow", "N_NEW": "1", "SIZE": "1",
                     "HPCCL_TIMEOUT": "60"})
    procs = [start("grow_ranks.py", dict(env, ROLE="old", RANK="0")), start("grow_ranks.py", dict(env, ROLE="new",
                                                                                           JOIN_RANK="0"))]
    outs = finish(procs)
    every = "\n".join(f"--- process {i} (exit {p.returncode}):\n{o[-3000:]}"
                      for i, (p, o) in enumerate(zip(procs, outs)))
    for i, (p, out) in enumerate(zip(procs, outs)):
        rows = results(out)
        assert p.returncode == 0 and len(rows) == 1, every
        row = rows[0]
        assert "error" not in row and "error_after" not in row, every
        assert row["size"] == 2 and row["rank"] == i and row["checked"] == every_at(2), row
        assert i == 1 or row["old_checked"] == every_at(1), row
