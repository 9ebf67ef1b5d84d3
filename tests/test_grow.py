"""grow and join (docs/api.md, docs/RELIABILITY.md "Elastic membership"): new processes join a live
communicator and every member gets a new communicator over old and new ranks, the old one still usable.

- kill, shrink, grow back (plain processes over a directory store, tests/scripts/grow_ranks.py): 4 ranks, one
  SIGKILLed in a loop of all_reduces; every survivor names it, shrinks it away, then grows by one fresh process
  (started after the victim died) back to 4; every call is checked on the grown communicator and on the shrunk
  one it grew from. One node, and two emulated nodes (the network engine between them).
- over MPI (tests/scripts/grow_mpi.py): a 2-rank mpiexec job grows by a second 2-rank mpiexec job through an MPI
  port; every call checked on the grown communicator and the old one.
- the errors: bad arguments named before anything moves (old ranks that disagree, a new MPI job of the wrong
  size among them); the side that never comes named within HPCCL_TIMEOUT
  (over a store and over MPI), the old communicator still usable."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import hpccl
from hpccl.bootstrap import StoreBootstrap
from mpirun import ROOT, results

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from dirstore import DirStore  # noqa: E402 - tests/scripts/dirstore.py
from grow_checks import every_call  # noqa: E402
from grow_drive import every_at, finish, kill_shrink_grow, plain_env, start  # noqa: E402


@pytest.mark.parametrize("nodes", [None, ["nodeA", "nodeA", "nodeB", "nodeB"]], ids=["one-node", "two-nodes"])
def test_kill_shrink_grow_back(nodes, tmp_path):
    """4 ranks, rank 1 SIGKILLed at its 200th all_reduce: each survivor names it (before HPCCL_TIMEOUT),
    shrinks to 3, grows by a fresh process back to 4 and every call is right on the grown and the shrunk
    communicator (tests/scripts/grow_drive.py); two-nodes: ranks 0-1 and the new process on one emulated
    node, 2-3 on the other (the network engine between them)."""
    kill_shrink_grow(tmp_path, nodes=nodes)


def test_grow_over_mpi_ports(tmp_path):
    """A 2-rank mpiexec job grows through an MPI port by a second 2-rank job: old ranks 0 and 1 keep their
    ranks, the new job's ranks are 2 and 3; every call right on the grown communicator and on the old one."""
    env = plain_env({"PORT_FILE": str(tmp_path / "port"), "N_NEW": "2", "HPCCL_TIMEOUT": "60"})
    old = start("grow_mpi.py", dict(env, ROLE="old"), mpi_n=2)
    new = start("grow_mpi.py", dict(env, ROLE="new"), mpi_n=2)
    outs = finish([old, new])
    every = f"--- old (exit {old.returncode}):\n{outs[0][-3000:]}\n--- new (exit {new.returncode}):\n{outs[1][-3000:]}"
    assert old.returncode == 0 and new.returncode == 0, every
    rows = {(row["role"], row["world_rank"]): row for out in outs for row in results(out)}
    assert len(rows) == 4, every
    for (role, w), row in rows.items():
        assert "error" not in row, row
        assert row["size"] == 4 and row["rank"] == (w if role == "old" else 2 + w), row
        assert row["checked"] == every_at(4), row
        if role == "old":
            assert row["old_checked"] == every_at(2), row


# an MPI process that opens a port, publishes it and never grows on it, until told to end (argv[2] exists)
_OPENER = ("import os, sys, time\nfrom mpi4py import MPI\np = MPI.Open_port()\n"
           "open(sys.argv[1] + '.tmp', 'w').write(p); os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
           "t = time.monotonic()\nwhile not os.path.exists(sys.argv[2]) and time.monotonic() - t < 60:\n"
           "    time.sleep(0.05)\nMPI.Close_port(p)\n")


def test_grow_over_mpi_names_the_side_that_never_came(tmp_path):
    """HPCCL_TIMEOUT=3: an old job whose port no process connects to raises HpcclTimeoutError naming the ranks
    the new processes would have had, within HPCCL_TIMEOUT + 3 s, and its communicator still works; a new job
    whose port nobody grows on raises HpcclTimeoutError within HPCCL_TIMEOUT + 3 s."""
    env = plain_env({"PORT_FILE": str(tmp_path / "port"), "N_NEW": "2", "HPCCL_TIMEOUT": "3"})
    old = start("grow_mpi.py", dict(env, ROLE="old", ALONE="1"), mpi_n=2)
    done = tmp_path / "done"
    opener = subprocess.Popen([sys.executable, "-c", _OPENER, str(tmp_path / "port"), str(done)], env=env)
    new = start("grow_mpi.py", dict(env, ROLE="new"), mpi_n=2)
    outs = finish([old, new])
    done.touch()
    assert opener.wait(timeout=60) == 0
    every = f"--- old:\n{outs[0][-3000:]}\n--- new:\n{outs[1][-3000:]}"
    old_rows, new_rows = results(outs[0]), results(outs[1])
    assert len(old_rows) == 2 and len(new_rows) == 2, every
    for row in old_rows:
        assert row["error"] == "HpcclTimeoutError" and row["missing"] == [2, 3], row
        assert "no new process connected" in row["message"] and "unchanged" in row["message"], row
        assert row["seconds"] < 3 + 3 and row["old_checked"][0] == "all_reduce" and len(row["old_checked"]) == 15, row
    for row in new_rows:
        assert row["error"] == "HpcclTimeoutError" and "never called grow" in row["message"], row
        assert row["seconds"] < 3 + 3, row


@pytest.fixture
def solo(tmp_path, monkeypatch):
    """A one-rank communicator over a directory store, HPCCL_TIMEOUT=2."""
    monkeypatch.setenv("HPCCL_TIMEOUT", "2")
    c = hpccl.Communicator(StoreBootstrap(DirStore(str(tmp_path)), 0, 1))
    yield c, DirStore(str(tmp_path))
    c.destroy()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_grow_names_a_bad_count(solo, bad):
    c, _ = solo
    with pytest.raises(hpccl.HpcclInvalidArgument) as e:
        c.grow(bad)
    assert e.value.argument == "n_new"


def test_grow_and_join_arguments(solo, tmp_path):
    c, store = solo
    with pytest.raises(hpccl.HpcclInvalidArgument, match="not both") as e:
        c.grow(1, port="x", store=store)
    assert e.value.argument == "port"
    with pytest.raises(hpccl.HpcclInvalidArgument, match="built over a store") as e:
        c.grow(1, port="x")
    assert e.value.argument == "port"
    with pytest.raises(hpccl.HpcclInvalidArgument, match="set") as e:
        c.grow(1, store=object())
    assert e.value.argument == "store"
    with pytest.raises(hpccl.HpcclInvalidArgument) as e:
        c.grow(1, key="")
    assert e.value.argument == "key"
    with pytest.raises(hpccl.HpcclInvalidArgument) as e:
        hpccl.join()
    assert e.value.argument == "port"
    for rank in (-1, None, "0"):
        with pytest.raises(hpccl.HpcclInvalidArgument) as e:
            hpccl.join(store=store, rank=rank)
        assert e.value.argument == "rank"
    with pytest.raises(hpccl.HpcclInvalidArgument) as e:
        hpccl.join(port="")
    assert e.value.argument == "port"


def test_grow_on_a_destroyed_or_aborted_communicator(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCCL_TIMEOUT", "2")
    c = hpccl.Communicator(StoreBootstrap(DirStore(str(tmp_path)), 0, 1))
    c.abort()
    with pytest.raises(hpccl.HpcclInvalidUsage, match="aborted"):
        c.grow(1)
    c.destroy()
    with pytest.raises(hpccl.HpcclInvalidUsage, match="destroyed"):
        c.grow(1)


def test_grow_over_a_store_names_the_new_ranks_that_never_came(solo):
    """No process joins: grow raises HpcclTimeoutError naming rank 1 (the one new rank) as a new process, after
    HPCCL_TIMEOUT; the old communicator still works; the key cannot be grown on again; a late join with a place
    at or past n_new is refused, naming 'rank'."""
    c, store = solo
    t0 = time.monotonic()
    with pytest.raises(hpccl.HpcclTimeoutError) as e:
        c.grow(1, key="g")
    took = time.monotonic() - t0
    assert e.value.missing == [1] and "new processes (hpccl.join)" in str(e.value) and "unchanged" in str(e.value)
    assert 2 <= took < 2 + 3, took
    x = np.arange(8.0)
    assert np.array_equal(c.all_reduce(x.copy()), x) and every_call(c)[-1] == "barrier"
    with pytest.raises(hpccl.HpcclInvalidArgument, match="earlier grow") as e2:
        c.grow(1, key="g")
    assert e2.value.argument == "key"
    with pytest.raises(hpccl.HpcclInvalidArgument, match="n_new=1") as e3:
        hpccl.join(store=store, rank=1, key="g")
    assert e3.value.argument == "rank"


def test_join_names_the_old_ranks_that_never_grew(solo):
    _, store = solo
    t0 = time.monotonic()
    with pytest.raises(hpccl.HpcclTimeoutError, match="never called grow with this key") as e:
        hpccl.join(store=store, rank=0, key="nobody")
    assert e.value.missing == [0] and 2 <= time.monotonic() - t0 < 2 + 3


def test_grow_over_mpi_refuses_a_new_job_of_the_wrong_size(tmp_path):
    """The old ranks grow by 2, a 1-rank job connects: both sides raise HpcclInvalidArgument (the old ranks
    naming 'n_new', the new process 'mpi_comm'), saying how many came; the old communicator still works."""
    env = plain_env({"PORT_FILE": str(tmp_path / "port"), "N_NEW": "2", "HPCCL_TIMEOUT": "30"})
    old = start("grow_mpi.py", dict(env, ROLE="old"), mpi_n=2)
    new = start("grow_mpi.py", dict(env, ROLE="new"), mpi_n=1)
    outs = finish([old, new])
    every = f"--- old:\n{outs[0][-3000:]}\n--- new:\n{outs[1][-3000:]}"
    old_rows, new_rows = results(outs[0]), results(outs[1])
    assert old.returncode == 0 and new.returncode == 0 and len(old_rows) == 2 and len(new_rows) == 1, every
    for row in old_rows:
        assert row["error"] == "HpcclInvalidArgument" and row["argument"] == "n_new", row
        assert "1 new process(es) connected, but n_new=2" in row["message"], row
        assert row["old_checked"] == every_at(2), row
    assert new_rows[0]["error"] == "HpcclInvalidArgument" and new_rows[0]["argument"] == "mpi_comm", new_rows[0]
    assert "n_new=2" in new_rows[0]["message"], new_rows[0]


def test_old_ranks_that_disagree_are_told_so(tmp_path):
    """Two old ranks over a store call grow with n_new 1 and 2: both raise HpcclInvalidArgument naming 'n_new'
    and listing what each rank passed, before any new process is waited for."""
    env = plain_env({"STORE_DIR": str(tmp_path), "HPCCL_TIMEOUT": "30", "ROLE": "old", "MODE": "grow", "SIZE": "2"})
    procs = [start("grow_ranks.py", dict(env, RANK=str(r), N_NEW=str(r + 1))) for r in range(2)]
    outs = finish(procs)
    for p, out in zip(procs, outs):
        rows = results(out)
        assert p.returncode == 0 and len(rows) == 1, out[-3000:]
        assert "HpcclInvalidArgument: [hpccl E2] argument 'n_new': the old ranks disagree: [1, 2]" in \
            rows[0]["error_after"], rows[0]


def test_grow_over_mpi_names_a_bad_port():
    """A one-rank MPI communicator (this process) given a port MPI cannot accept on, or none: HpcclInvalidArgument
    naming 'port' at once; the communicator still works."""
    c = hpccl.init()
    try:
        with pytest.raises(hpccl.HpcclInvalidArgument, match="MPI_Comm_accept failed") as e:
            c.grow(1, port="not-a-port")
        assert e.value.argument == "port"
        with pytest.raises(hpccl.HpcclInvalidArgument, match="open_port") as e:
            c.grow(1)
        assert e.value.argument == "port"
        x = np.arange(5.0)
        assert np.array_equal(c.all_reduce(x.copy()), x)
    finally:
        c.destroy()


def test_an_mpi_job_grows_over_a_store(tmp_path):
    """A 2-rank mpiexec job grows over a directory store by one plain process (hpccl.join(store=..., rank=0)):
    ranks 0, 1 then the new one as 2; every call right on the grown communicator and on the old one."""
    env = plain_env({"STORE_DIR": str(tmp_path), "KEY": "mixed", "N_NEW": "1", "HPCCL_TIMEOUT": "60"})
    old = start("grow_mpi.py", dict(env, ROLE="old"), mpi_n=2)
    new = start("grow_ranks.py", dict(env, ROLE="new", JOIN_RANK="0"))
    outs = finish([old, new])
    every = f"--- old:\n{outs[0][-3000:]}\n--- new:\n{outs[1][-3000:]}"
    old_rows, new_rows = results(outs[0]), results(outs[1])
    assert old.returncode == 0 and new.returncode == 0 and len(old_rows) == 2 and len(new_rows) == 1, every
    for row in old_rows:
        assert "error" not in row and row["size"] == 3 and row["rank"] == row["world_rank"], row
        assert row["checked"] == every_at(3) and row["old_checked"] == every_at(2), row
    assert "error" not in new_rows[0] and new_rows[0]["rank"] == 2 and new_rows[0]["checked"] == every_at(3), every
