"""Without the native network engine (not built: no compiler or no UCX headers at install), calls across
nodes still work on the slower ucxx path, one warning names the fix, and HPCCL_NET=engine refuses clearly
on every rank."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpirun import results, run_mpi  # noqa: E402

import importlib.util

if importlib.util.find_spec("ucxx") is None:  # not imported here: ucxx's import rewrites the environment
    pytest.skip("ucxx is not installed (pip install hpccl[ucx]): the fallback path needs it", allow_module_level=True)


def test_missing_engine_falls_back_with_one_warning():
    proc = run_mpi(2, ["tests/scripts/engine_missing.py"],
                   env={"HPCCL_NODE_ID": "split:1", "UCX_TLS": "tcp,self", "HPCCL_CHECK_ENV": "0"}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert len(rows) == 2, proc.stdout[-4000:]
    for row in rows:
        assert row["ok"] and row["nodes"] == 2 and row["impl"] == ["ucxx"], row
        assert row["insist"] and row["insist"].startswith("HpcclUnsupported") and "HPCCL_NET=engine" in row["insist"] \
            and "[0, 1]" in row["insist"], row
    assert len(rows[0]["warnings"]) == 1 and "UCX headers" in rows[0]["warnings"][0], rows[0]
    assert rows[1]["warnings"] == [], rows[1]
