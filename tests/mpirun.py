"""Shared test helpers: launching a script or a pytest file under mpiexec with a bound on its time,
reading the records scripts print, and checking /dev/shm."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mpiexec() -> List[str]:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        pytest.fail("mpiexec not found: install an MPI (pip install mpich) before running the tests")
    cmd = [exe]
    if "Open MPI" in subprocess.run([exe, "--version"], capture_output=True, text=True).stdout:
        cmd += ["--oversubscribe"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd


def run_mpi(n: int, args: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 600,
            ) -> subprocess.CompletedProcess:
    """Run ``python args...`` on n ranks; returns the completed process (stdout and stderr merged)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("HPCCL_TIMEOUT", "60")
    e.update(env or {})
    cmd = mpiexec() + ["-n", str(n), sys.executable] + args
    return subprocess.run(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)


def shm_leftovers() -> List[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith("hpccl-")] if os.path.isdir("/dev/shm") else []


def shm_snapshot() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def remove_mpi_leftovers(before: set) -> List[str]:
    """MPI libraries leave their own segments behind when a test kills a rank on purpose; remove the
    ones that appeared during the test (never hpccl's: those must not exist) and return their names."""
    new = [f for f in shm_snapshot() - before if f.startswith(("mpich_shm_", "sm_segment", "psm"))]
    for f in new:
        try:
            os.unlink(os.path.join("/dev/shm", f))
        except OSError:
            pass
    return new


def results(stdout: str) -> List[dict]:
    """Every 'RESULT {json}' record a script printed (ranks' lines may interleave)."""
    import json
    dec, out, i = json.JSONDecoder(), [], stdout.find("RESULT ")
    while i >= 0:
        obj, end = dec.raw_decode(stdout, i + 7)
        out.append(obj)
        i = stdout.find("RESULT ", end)
    return out
