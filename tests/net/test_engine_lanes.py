"""Lanes of the native network engine (EngineTransport.add_lanes, HPCCL_NET_LANES): engines of their own
that GPU network steps spread a message's slices over (hpccl/gpu/netstep.py). Made collectively on a
communicator of 2 nodes, each lane carries its own messages, the automatic count follows the rule the
README gives, an abort reaches every lane."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpirun import results, run_mpi  # noqa: E402

pytest.importorskip("hpccl.transport.engine", reason="the network engine (UCX) is not built here")


@pytest.mark.parametrize("setting", ["0", "3"])
def test_lanes_are_made_carry_messages_and_abort_together(setting):
    proc = run_mpi(2, ["tests/scripts/engine_lanes.py"],
                   env={"HPCCL_NODE_ID": "split:1", "UCX_TLS": "tcp,self", "HPCCL_CHECK_ENV": "0",
                        "HPCCL_NET_LANES": setting}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = sorted(results(proc.stdout), key=lambda r: r["rank"])
    assert len(rows) == 2, proc.stdout[-4000:]
    for row in rows:
        assert row["lanes"] == 3 and row["moved"], row
        # auto: no RDMA transport under tcp,self: min(4, half the cores of the rank's node)
        want = 3 if setting == "3" else max(1, min(4, row["cores"] // 2))
        assert row["auto"] == want, row
    assert rows[0]["aborted"] and rows[0]["abort_s"] < 5, rows[0]
