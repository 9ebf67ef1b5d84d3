"""Without the native network engine (not built: no compiler or no UCX headers at install), calls across
nodes still work over MPI (the one other network path), rank 0 warns once naming why, hpccl-info says which
path is in use, and HPCCL_NET=engine (or ucx) refuses clearly on every rank; HPCCL_NET=ucxx, the removed
transport, is refused naming the variable."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpirun import results, run_mpi  # noqa: E402

from hpccl.errors import HpcclInvalidArgument  # noqa: E402
from hpccl.transport import select  # noqa: E402


def test_missing_engine_falls_back_to_mpi_with_one_warning_and_info_says_so():
    proc = run_mpi(2, ["tests/scripts/engine_missing.py"],
                   env={"HPCCL_NODE_ID": "split:1", "HPCCL_CHECK_ENV": "0"}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert len(rows) == 2, proc.stdout[-4000:]
    for row in rows:
        assert row["ok"] and row["nodes"] == 2 and row["impl"] == ["mpi"], row
        assert row["path"].startswith("MPI: the native engine cannot load") and "UCX headers" in row["path"], row
        for want in ("engine", "ucx"):
            insist = row[f"insist_{want}"]
            assert insist and insist.startswith("HpcclUnsupported") and f"HPCCL_NET={want}" in insist \
                and "[0, 1]" in insist, row
    assert len(rows[0]["warnings"]) == 1 and "UCX headers" in rows[0]["warnings"][0], rows[0]
    assert "slower MPI path" in rows[0]["warnings"][0], rows[0]
    assert rows[1]["warnings"] == [], rows[1]
    # hpccl-info, run by the same ranks: the engine is missing and MPI carries the calls across nodes
    assert "native engine not available" in proc.stdout and "slower MPI path" in proc.stdout, proc.stdout[-4000:]
    assert "network path: MPI: the native engine cannot load" in proc.stdout, proc.stdout[-4000:]


@pytest.mark.parametrize("value", ["ucxx", "UCXX", "tcp"])
def test_hpccl_net_refuses_removed_or_unknown_values_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("HPCCL_NET", value)
    with pytest.raises(HpcclInvalidArgument, match="HPCCL_NET") as err:
        select.net_choice()
    if value.lower() == "ucxx":
        assert "removed" in str(err.value) and "mpi" in str(err.value), err.value


@pytest.mark.parametrize("value,want", [("", ""), ("ucx", "ucx"), ("ENGINE", "engine"), ("mpi", "mpi")])
def test_hpccl_net_accepted_values(monkeypatch, value, want):
    monkeypatch.setenv("HPCCL_NET", value)
    assert select.net_choice() == want
