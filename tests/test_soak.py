"""Soak: 5 x 10^4 (CI-sized; 10^5 measured, RELIABILITY) mixed collectives on 4 ranks (sizes log-uniform 0-4 MiB, four dtypes, every result checked;
tests/scripts/soak.py), with resident memory, open file descriptors and /dev/shm entries flat from call
1000 to the end. SOAK_OPS sets the number of calls."""
from __future__ import annotations

import os

from mpirun import results, run_mpi, shm_leftovers

OPS = int(os.environ.get("SOAK_OPS", "50000"))


def test_soak_mixed_collectives_flat_resources():
    proc = run_mpi(4, ["tests/scripts/soak.py"], env={"SOAK_OPS": str(OPS)}, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == 4, proc.stdout[-3000:]
    for row in rows:
        assert row["ops"] == OPS and row["nbad"] == 0, row["bad"]
        s = [x for x in row["samples"] if x["op"] >= 1000]
        assert s, row
        mib = [x["rss"] / 2**20 for x in s]
        assert max(mib) - mib[0] < 32 and mib[-1] - mib[0] < 16, (row["rank"], mib)
        assert len({x["fds"] for x in s}) == 1, (row["rank"], s)
        assert all(x["shm"] == 0 for x in row["samples"]), row["samples"]
    assert shm_leftovers() == []
