"""Driving a kill-shrink-grow job of plain processes (tests/scripts/grow_ranks.py) and checking what each
process reported: for tests/test_grow.py (host buffers) and tests/gpu/test_grow_gpu.py (GPU buffers)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from mpirun import ROOT, results, shm_snapshot  # tests/mpirun.py

SCRIPTS = Path(__file__).resolve().parent
EVERY = ["all_reduce", "all_gather", "reduce_scatter", "broadcast(root=0)", "reduce(root=0)", "broadcast(root=3)",
         "reduce(root=3)", "all_to_all", "all_gather_v", "reduce_scatter_v", "all_to_all_v", "gather", "scatter",
         "barrier", "send/recv"]


def every_at(size: int) -> List[str]:
    """EVERY's names for a communicator of ``size`` ranks (its last rank is a root; one rank sends to none)."""
    return [c.replace("root=3", f"root={size - 1}") for c in EVERY if size > 1 or c != "send/recv"]


def plain_env(extra: Dict[str, str]) -> Dict[str, str]:
    """This environment without an MPI launcher's variables (a plain process), hpccl importable."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PMIX", "MPI_", "HYDRA"))}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


def start(script: str, env: Dict[str, str], mpi_n: int = 0) -> subprocess.Popen:
    """``python tests/scripts/script``, or under mpiexec -n mpi_n; stdout and stderr merged."""
    from mpirun import mpiexec
    cmd = (mpiexec() + ["-n", str(mpi_n)] if mpi_n else []) + [sys.executable, str(SCRIPTS / script)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs: List[subprocess.Popen], timeout: float = 120) -> List[str]:
    """Every process's output; a hang ends every process (each by its own pid) and is reported."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            outs.append(p.communicate()[0] + "\n(killed by the test: it hung)")
    return outs


def kill_shrink_grow(store_dir: Path, n: int = 4, victim: int = 1, nodes: Optional[List[str]] = None,
                     extra: Optional[Dict[str, str]] = None, per_rank=lambda r: {}) -> None:
    """n ranks, ``victim`` SIGKILLed at its 200th all_reduce: each survivor raises HpcclRemoteError naming it
    before HPCCL_TIMEOUT (30 s: the death is seen, not waited out), shrinks to n-1, grows by a fresh process
    (started once the victim is gone) back to n (survivors keep their shrunk ranks, the new process is rank
    n-1), and every call is right on the grown communicator and on the shrunk one; nothing new is left in
    /dev/shm. ``per_rank(r)``: a process's own variables (r = n: the new process)."""
    shm_before = {f for f in shm_snapshot() if "hpccl" in f}
    base = dict(extra or {}, STORE_DIR=str(store_dir), MODE="kill", N_NEW="1", VICTIM=str(victim))
    base.setdefault("HPCCL_TIMEOUT", "30")
    node = (lambda r: {"HPCCL_NODE_ID": nodes[r]}) if nodes else (lambda r: {})
    procs = [start("grow_ranks.py", plain_env(dict(base, ROLE="old", RANK=str(r), SIZE=str(n), **node(r),
                                                   **per_rank(r)))) for r in range(n)]
    try:
        procs[victim].wait(timeout=90)
    except subprocess.TimeoutExpired:
        pass
    newcomer = start("grow_ranks.py", plain_env(dict(base, ROLE="new", JOIN_RANK="0", **node(victim), **per_rank(n))))
    outs = finish(procs + [newcomer])
    every = "\n".join(f"--- process {i} (exit {p.returncode}):\n{o[-3000:]}" for i, (p, o) in
                      enumerate(zip(procs + [newcomer], outs)))
    assert procs[victim].returncode == -9 and (store_dir / "victim_at").exists(), every
    at = float((store_dir / "victim_at").read_text())
    survivors = [r for r in range(n) if r != victim]
    for r in survivors:
        rows = results(outs[r])
        assert procs[r].returncode == 0 and len(rows) == 1 and "error_after" not in rows[0], every
        row = rows[0]
        assert row["error"] == "HpcclRemoteError" and row["failed"] == victim, row
        assert row["at"] - at < float(base["HPCCL_TIMEOUT"]), (row["at"] - at, row)  # seen, not waited out
        assert row["shrunk_size"] == n - 1 and row["shrunk_rank"] == survivors.index(r), row
        assert row["size"] == n and row["rank"] == survivors.index(r), row
        assert row["nodes"] == len(set(nodes or [None])), row  # the grown communicator's nodes, as laid out
        assert row["checked"] == every_at(n) and row["old_checked"] == every_at(n - 1), row
    rows = results(outs[n])
    assert newcomer.returncode == 0 and len(rows) == 1 and "error" not in rows[0], every
    assert rows[0]["size"] == n and rows[0]["rank"] == n - 1 and rows[0]["checked"] == every_at(n), rows[0]
    assert {f for f in shm_snapshot() if "hpccl" in f} - shm_before == set()
