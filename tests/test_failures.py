"""Peers that never arrive, and processes that die: errors within HPCCL_TIMEOUT, nothing left behind."""
from __future__ import annotations

import pytest

from mpirun import remove_mpi_leftovers, results, run_mpi, shm_leftovers, shm_snapshot


@pytest.mark.parametrize("n,algo", [(2, ""), (3, "ring"), (4, "twoshot"), (3, "tree")])
def test_skipped_collective_times_out_naming_the_missing_rank(n, algo):
    timeout = 2.0
    proc = run_mpi(n, ["tests/scripts/skip_collective.py", algo], env={"HPCCL_TIMEOUT": str(timeout)},
                   timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == n, proc.stdout
    waiting = [row for row in rows if row["rank"] != n - 1]
    timeouts = [row for row in waiting if row["error"] == "HpcclTimeoutError"]
    assert timeouts, waiting
    for row in waiting:
        assert row["error"] in ("HpcclTimeoutError", "HpcclRemoteError"), row
        assert "all_reduce #2" in row["message"], row
        assert f"[{n - 1}]" in row["message"], row
        assert row["seconds"] < timeout + 3.0, row
        assert "aborted" in row["after"], row
    for row in timeouts:
        assert row["missing"] == [n - 1] and row["code"] == 4
    assert shm_leftovers() == []


def test_mpi_transport_timeout_names_the_awaited_rank():
    proc = run_mpi(3, ["tests/scripts/skip_collective.py", "ring"],
                   env={"HPCCL_TIMEOUT": "2", "HPCCL_NODE_ID": "split:1", "HPCCL_NET": "mpi"}, timeout=120)
    rows = results(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    errs = [row for row in rows if row["rank"] != 2]
    assert all(row["error"] in ("HpcclTimeoutError", "HpcclRemoteError") for row in errs), errs
    assert any(row["missing"] == [2] for row in errs if row["error"] == "HpcclTimeoutError"), errs


def test_killed_rank_leaves_no_shared_memory():
    before = shm_snapshot()
    proc = run_mpi(3, ["tests/scripts/killed_rank.py"], timeout=120)
    remove_mpi_leftovers(before)
    assert proc.returncode != 0  # the launcher reports the killed rank
    assert shm_leftovers() == [], shm_leftovers()


def test_rank_that_never_calls_init_gives_timeout_not_hang():
    before = shm_snapshot()
    proc = run_mpi(3, ["tests/scripts/skip_init.py"], env={"HPCCL_TIMEOUT": "2"}, timeout=120)
    remove_mpi_leftovers(before)
    rows = [row for row in results(proc.stdout) if row["rank"] != 2]
    assert len(rows) == 2, proc.stdout[-3000:]
    for row in rows:
        assert row["error"] == "HpcclTimeoutError" and "bootstrap init" in row["message"], row
        assert row["seconds"] < 5, row
