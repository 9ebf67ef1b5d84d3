"""Peers that never arrive, and processes that die: errors within HPCCL_TIMEOUT, nothing left behind."""
from __future__ import annotations

import importlib.util

import pytest

from mpirun import remove_mpi_leftovers, results, run_mpi, shm_leftovers, shm_snapshot, start_plain


@pytest.mark.parametrize("n,algo", [(2, ""), (3, "ring"), (4, "twoshot"), (3, "tree"), (3, "hot"), (4, "hot"),
                                    (3, "hot-bcast"), (3, "hot-ag"), (3, "hot-ar")])
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
        coll = {"hot-bcast": "broadcast", "hot-ag": "all_gather"}.get(algo, "all_reduce")
        assert f"{coll} #2" in row["message"], row
        assert f"[{n - 1}]" in row["message"], row
        assert row["seconds"] < timeout + 3.0, row
        assert "aborted" in row["after"], row
    for row in timeouts:
        assert row["missing"] == [n - 1] and row["code"] == 4
    assert shm_leftovers() == []


_ENGINE = importlib.util.find_spec("hpccl._netengine") is not None
_NO_ENGINE = "hpccl's network engine is not built (no UCX headers at install); the other cases still run"


_IF_ENGINE = pytest.mark.skipif(not _ENGINE, reason=_NO_ENGINE)


@pytest.mark.parametrize("n,net,algo", [(3, "mpi", "ring"), (4, "mpi", "ring"),
    pytest.param(3, "engine", "ring", marks=_IF_ENGINE), pytest.param(4, "engine", "ring", marks=_IF_ENGINE),
    pytest.param(3, "engine", "hot", marks=_IF_ENGINE), pytest.param(4, "engine", "hot", marks=_IF_ENGINE)])
def test_network_timeout_names_the_rank_that_never_arrived(n, net, algo):
    """Between nodes (every rank its own node) each waiting rank asks the others over the transport's
    control channel which collective they are in: all name the rank that never came, not the neighbour
    their ring waited on (the ring, and the compiled path across nodes, hpccl/csrc/_nethot.c)."""
    proc = run_mpi(n, ["tests/scripts/skip_collective.py", algo],
                   env={"HPCCL_TIMEOUT": "2", "HPCCL_NODE_ID": "split:1", "HPCCL_NET": net}, timeout=120)
    rows = results(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    errs = [row for row in rows if row["rank"] != n - 1]
    assert len(errs) == n - 1, proc.stdout[-3000:]
    for row in errs:
        assert row["error"] in ("HpcclTimeoutError", "HpcclRemoteError"), row
        assert row["seconds"] < 2 + 2, row
        if row["error"] == "HpcclTimeoutError":
            assert row["missing"] == [n - 1], row
        else:  # it heard a timed-out peer's abort, which carries the rank that never came
            assert f"rank {n - 1} failed" in row["message"], row


@pytest.mark.parametrize("layout", ["shm", "mpi", "hier-mpi",
                                    pytest.param("engine", marks=pytest.mark.skipif(not _ENGINE, reason=_NO_ENGINE)),
                                    pytest.param("hier-engine", marks=pytest.mark.skipif(not _ENGINE,
                                                                                         reason=_NO_ENGINE))])
def test_abort_reaches_every_peer_naming_the_failed_rank(layout):
    """A rank that fails between collectives: every peer inside the next one fails within a second (not
    HPCCL_TIMEOUT) with HpcclRemoteError naming it, on shared memory, over MPI and the engine, and
    through hier."""
    env = {"HPCCL_TIMEOUT": "30"}
    net = layout.split("-")[-1]
    if layout in ("mpi", "engine"):
        env.update(HPCCL_NODE_ID="split:1", HPCCL_NET=net)
    elif layout.startswith("hier"):
        env.update(HPCCL_NODE_ID="split:2", HPCCL_NET=net)
    n = 4
    proc = run_mpi(n, ["tests/scripts/abort_peer.py"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = [row for row in results(proc.stdout) if row["rank"] != n - 1]
    assert len(rows) == n - 1, proc.stdout[-3000:]
    for row in rows:
        assert row["error"] == "HpcclRemoteError" and row["code"] == 8, row
        assert f"rank {n - 1} failed" in row["message"] and "all_reduce #2" in row["message"], row
        assert row["seconds"] < 0.3 + 1.0, row  # the failing rank aborts 0.3 s into the collective
    if layout == "shm":  # the abort also set every rank's GPU error word (kernels would exit at once)
        assert sorted(row.get("gpu_word") for row in results(proc.stdout)) == [2] * n, proc.stdout[-3000:]
    assert shm_leftovers() == []


def test_killed_rank_leaves_no_shared_memory():
    before = shm_snapshot()
    proc = run_mpi(3, ["tests/scripts/killed_rank.py"], timeout=120)
    remove_mpi_leftovers(before)
    assert proc.returncode != 0  # the launcher reports the killed rank
    assert shm_leftovers() == [], shm_leftovers()


def test_rank_killed_inside_shm_setup_leaves_no_segment(tmp_path):
    """A rank SIGKILLed between creating its segment and its peers mapping it (the one window in which
    nothing has unlinked it yet): the survivors time out naming it and unlink its segment for it."""
    n = 3
    before = {f for f in shm_snapshot() if f.startswith("hpccl-")}
    procs = start_plain(n, "tests/scripts/die_in_setup.py", tmp_path, {"HPCCL_TIMEOUT": "2"})
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[-1].returncode == -9, outs[-1][-2000:]
    rows = [row for out in outs[:-1] for row in results(out)]
    assert len(rows) == n - 1, outs
    for row in rows:
        assert row["error"] == "HpcclTimeoutError" and row["missing"] == [n - 1], row
    assert {f for f in shm_snapshot() if f.startswith("hpccl-")} - before == set()


def test_rank_that_never_calls_init_gives_timeout_not_hang():
    before = shm_snapshot()
    proc = run_mpi(3, ["tests/scripts/skip_init.py"], env={"HPCCL_TIMEOUT": "2"}, timeout=120)
    remove_mpi_leftovers(before)
    rows = [row for row in results(proc.stdout) if row["rank"] != 2]
    assert len(rows) == 2, proc.stdout[-3000:]
    for row in rows:
        assert row["error"] == "HpcclTimeoutError" and "bootstrap init" in row["message"], row
        assert row["seconds"] < 5, row
    # rank 0 counts the ranks in and tells the ones that came which did not: all name rank 2
    assert all(row["missing"] == [2] for row in rows), rows


@pytest.mark.parametrize("n,layout", [(3, "node"), (4, "node"), pytest.param(3, "engine-tcp", marks=_IF_ENGINE),
                                      pytest.param(4, "engine-tcp", marks=_IF_ENGINE)])
def test_dead_rank_is_named_at_once(n, layout, tmp_path):
    """A rank SIGKILLed inside a collective (ranks started as plain processes, so the survivors live on):
    every survivor fails within a second (HPCCL_TIMEOUT is 30 s) naming exactly the dead rank, seen gone
    by its pid (one node) or by UCX's peer-failure handling (every rank its own node, UCX over TCP), or
    passed on as the abort of the rank that saw it. Nothing left in /dev/shm or running."""
    import subprocess
    env = {"HPCCL_TIMEOUT": "30"}
    if layout.endswith("-tcp"):  # hpccl's engine
        env.update(HPCCL_NODE_ID="split:1", HPCCL_UCX_TLS="tcp,self", HPCCL_NET=layout.split("-")[0])
    procs = start_plain(n, "tests/scripts/die_peer.py", tmp_path, env)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[-1].returncode == -9, outs[-1][-2000:]
    rows = [row for out in outs[:-1] for row in results(out)]
    assert len(rows) == n - 1 and all(p.returncode == 0 for p in procs[:-1]), outs
    for row in rows:
        assert row["error"] == "HpcclRemoteError" and row["failed"] == n - 1, row
        assert f"rank {n - 1} " in row["message"] and "all_reduce #2" in row["message"], row
        assert row["seconds"] < 0.3 + 1.0, row
    assert any("died" in row["message"] for row in rows), rows
    assert shm_leftovers() == []
    left = subprocess.run(["pgrep", "-f", "tests/scripts/die_peer.py"], capture_output=True, text=True).stdout
    assert left.strip() == "", left


@pytest.mark.parametrize("n,layout", [(3, "shm"), (4, "shm"), (4, "mpi"), pytest.param(4, "hier-engine", marks=_IF_ENGINE),
                                      pytest.param(3, "engine", marks=_IF_ENGINE)])
def test_shrink_after_a_stopped_rank(n, layout):
    """The last rank is SIGSTOPped: the others fail within HPCCL_TIMEOUT (+ the MPI survey) naming it (or
    the abort of the survivor that timed out first), shrink it away with no collective over it, and run
    20 checked collectives on the survivors; the stopped rank is resumed and finishes normally."""
    env = {"HPCCL_TIMEOUT": "2"}
    if layout == "mpi":
        env.update(HPCCL_NODE_ID="split:1", HPCCL_NET="mpi")
    elif layout == "hier-engine":  # 2 nodes x 2 ranks, the engine between; the survivors are 2 + 1
        env.update(HPCCL_NODE_ID="split:2", HPCCL_NET="engine")
    elif layout == "engine":  # every rank its own node, the engine between
        env.update(HPCCL_NODE_ID="split:1", HPCCL_NET="engine")
    proc = run_mpi(n, ["tests/scripts/shrink_after_stop.py"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = {row["rank"]: row for row in results(proc.stdout)}
    assert sorted(rows) == list(range(n)) and rows[n - 1].get("resumed"), proc.stdout[-3000:]
    for r in range(n - 1):
        row = rows[r]
        assert row["error"] in ("HpcclTimeoutError", "HpcclRemoteError"), row
        if row["error"] == "HpcclTimeoutError":
            assert row["missing"] == [n - 1], row
        assert row["seconds"] < 2 + 1.5, row
        assert row["new_size"] == n - 1 and row["new_rank"] == r and row["good"] == 20, row
    assert shm_leftovers() == []


@pytest.mark.parametrize("layout", ["shm", "mpi", pytest.param("engine", marks=pytest.mark.skipif(
    not _ENGINE, reason=_NO_ENGINE))])
def test_desync_is_named_on_every_rank(layout):
    """HPCCL_CHECK=1: checked calls run as usual; when one rank calls all_gather while the others call
    all_reduce, every rank raises HpcclInvalidUsage at once naming both groups of ranks and their calls."""
    env = {"HPCCL_CHECK": "1", "HPCCL_TIMEOUT": "20"}
    if layout in ("mpi", "engine"):
        env.update(HPCCL_NODE_ID="split:1", HPCCL_NET=layout)
    n = 3
    proc = run_mpi(n, ["tests/scripts/desync.py"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = results(proc.stdout)
    assert len(rows) == n, proc.stdout[-3000:]
    for row in rows:
        assert row["ok"] and row["error"] == "HpcclInvalidUsage", row
        assert "rank(s) [0, 1]: all_reduce 400 B float32 sum" in row["message"], row
        assert "rank(s) [2]: all_gather 300 B float32" in row["message"], row
        assert row["seconds"] < 5 and row["after"], row


def test_check_signatures_unit():
    import numpy as np
    from hpccl.observe import check
    same = np.array([[0, 400, 8, 0, -1, 0]] * 3)
    assert check.disagreement(same) == []
    diff = same.copy()
    diff[1, 4] = 2  # a different root
    got = check.disagreement(diff)
    assert [g[0] for g in got] == [[0, 2], [1]] and "root 2" in got[1][1] and "root" not in got[0][1]


def test_flight_recorder_dumps_and_analysis(tmp_path):
    """HPCCL_DUMP_DIR: every rank that times out dumps on its abort, the stuck rank dumps on SIGUSR1, and
    hpccl-info --analyze names the rank that stopped before the call the others are in."""
    import json
    import subprocess
    import sys
    proc = run_mpi(4, ["tests/scripts/flight_recorder.py"], env={"HPCCL_TIMEOUT": "2",
                                                                "HPCCL_DUMP_DIR": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    dumps = sorted(tmp_path.glob("hpccl-*-rank*.json"))
    assert len(dumps) == 4, (dumps, proc.stdout[-2000:])
    by_rank = {d["rank"]: d for d in (json.loads(p.read_text()) for p in dumps)}
    assert by_rank[3]["reason"] == "SIGUSR1" and [c["seq"] for c in by_rank[3]["calls"]] == [1, 2]
    for r in range(3):
        last = by_rank[r]["calls"][-1]
        assert last["seq"] == 3 and last["collective"] == "all_reduce" and last["state"] == "running", last
        assert by_rank[r]["calls"][0]["state"] == "done" and by_rank[r]["calls"][0]["algorithm"], by_rank[r]
    out = subprocess.run([sys.executable, "-m", "hpccl.cli.info", "--analyze", str(tmp_path)],
                         capture_output=True, text=True, timeout=60).stdout
    assert "4 of 4 ranks dumped" in out and "ranks [0, 1, 2] reached all_reduce #3; ranks [3] stopped before it" in out, out


def test_gpu_timeout_names_ranks_that_never_launched():
    """The GPU engine publishes its launch count in the rank's shared-memory segment; when a kernel's wait
    times out, the ranks whose count is behind are named (they never made the call). Host-only check of
    the reading side with stand-ins; tests/gpu/test_cuda_failures.py::test_timeout_is_reported runs it on a GPU."""
    import types
    from hpccl.gpu.cuda_comm import CudaComm
    counts = {0: 7, 1: 7, 2: 6, 3: 9}
    fake = types.SimpleNamespace(_shm=types.SimpleNamespace(launched=counts.get), fs=types.SimpleNamespace(seq=7),
                                 comm=types.SimpleNamespace(size=4, rank=0))
    assert CudaComm.never_launched(fake) == [2]
    fake._shm = None  # no shared memory (HPCCL_TRANSPORT=mpi): nothing to read
    assert CudaComm.never_launched(fake) == []


def test_a_node_step_stopped_by_a_failed_network_step_names_the_rank_at_fault():
    """The error word a failed hier network step sets (ERR_NET, this rank's own step) or a kernel sets on
    seeing it in a local peer's word (ERR_PEER + k): the rank raises naming the rank the abort that follows
    carries; without one heard, local rank k for a peer's step (after a moment), and for its own step an
    HpcclSystemError that points at synchronize, never "aborted on this rank". Host-only, with stand-ins."""
    import ctypes
    import types
    from hpccl.gpu.cuda_comm import CudaComm
    from hpccl.errors import HpcclRemoteError, HpcclSystemError
    from hpccl.kernels import ERR_NET, ERR_PEER

    def fake(word, heard, seen=None):
        told = []
        f = types.SimpleNamespace(_err=ctypes.c_uint32(word), _failed=False, fs=types.SimpleNamespace(seq=6, live=1),
                                  drop=lambda: None, _what="all_gather", watchdog=types.SimpleNamespace(dead=None),
                                  comm=types.SimpleNamespace(rank=0, size=2, abort=told.append,
                                                             _peer_aborted=lambda: heard,
                                                             _seen_failure=lambda wait: seen))
        f._heard_origin = types.MethodType(CudaComm._heard_origin, f)
        return f, told

    f, told = fake(ERR_PEER + 1, None)
    with pytest.raises(HpcclRemoteError) as info:
        CudaComm._fail(f, "synchronize")
    assert info.value.rank == 1 and "all_gather #6" in str(info.value) and told == [1]
    f, told = fake(ERR_PEER + 1, -5)  # the abort names user rank 3 (outside this 2-rank node: -(3+2))
    with pytest.raises(HpcclRemoteError) as info:
        CudaComm._fail(f, "synchronize")
    assert info.value.rank == -5 and told == [-5]
    f, told = fake(ERR_NET, None)
    with pytest.raises(HpcclSystemError, match="network step of this node failed"):
        CudaComm._fail(f, "all_gather")
    # its own step failed before this rank's host looked (a hier chain's node step enqueued after the network
    # step): what the parent's watch sees is named and passed on, not this rank (user rank 0 outside: -2)
    f, told = fake(ERR_NET, None, seen=-2)
    with pytest.raises(HpcclRemoteError) as info:
        CudaComm._fail(f, "all_gather")
    assert info.value.rank == -2 and told == [-2] and "all_gather #6" in str(info.value)


def test_a_hier_steps_gpu_failure_met_before_its_call_is_named_in_the_users_numbering(monkeypatch):
    """A hier chain's sub-calls go through the sub-communicators' own front ends, whose checks can meet an
    earlier GPU failure before the call's _run: it is raised in the user's numbering (a rank outside the
    node, -(r+2) on the wire, is user rank r), and the rank a hier step's parent sees fail is given in the
    step's wire numbering (_seen_failure, used when its own network step failed first). Host-only, stand-ins."""
    import types
    from hpccl.core.comm import Communicator
    from hpccl.errors import HpcclRemoteError
    from hpccl.runtime import failures

    def raise_remote(what):
        raise HpcclRemoteError.aborted(what, 6, -7, [-7], "")
    parent = types.SimpleNamespace(_numbering=object(), _parent=None)
    sub = types.SimpleNamespace(_dev=types.SimpleNamespace(check=raise_remote), _parent=parent, parent_ranks=[0, 1])
    with pytest.raises(HpcclRemoteError) as info:
        Communicator._check_device(sub, "all_gather")
    assert info.value.rank == 5 and info.value.awaited == [5] and "rank 5 " in str(info.value), info.value
    seen = iter([None, None, HpcclRemoteError.died("all_reduce", 6, 4, "its connection was lost", [], "")])
    monkeypatch.setattr(failures, "watch", lambda comm: next(seen))
    assert Communicator._seen_failure(sub, 5.0) == -6  # user rank 4, outside this node's [0, 1]
    monkeypatch.setattr(failures, "watch", lambda comm: None)
    assert Communicator._seen_failure(sub, 0.01) is None
    assert Communicator._seen_failure(types.SimpleNamespace(_parent=None), 1.0) is None


def test_a_hier_step_ended_by_an_abort_names_the_rank_the_abort_passes_on():
    """A hier network step ended by an abort whose origin its engine was not told (E_ABORT, no rank: a peer's
    abort passing on a rank outside that sub-communicator) is raised naming the rank the user's
    communicator hears of, even when that word arrives a moment after the step ended (the stopped-rank
    case at 2 x 2 on GPU buffers); with nothing heard it stays the engine's error. Host-only, stand-ins."""
    import types
    from hpccl.errors import HpcclRemoteError
    from hpccl.runtime.failures import in_call
    from hpccl.transport import engine

    exc = engine.engine_error((engine._ne.E_ABORT, -1, "the communicator was aborted"))
    assert exc.aborted
    exc.in_call = ("reduce_scatter", 8, "step 2 (inter reduce_scatter)")
    words = iter([None] * 20 + [2])
    heard = types.SimpleNamespace(peer_aborted=lambda: next(words, 2))
    comm = types.SimpleNamespace(_transports=[heard], _parent=None, _numbering=object(), parent_ranks=None, rank=1)
    out = in_call(exc, comm)
    assert isinstance(out, HpcclRemoteError) and out.rank == 2, out
    assert "reduce_scatter #8" in str(out) and "in its hierarchical step 2" in str(out), out
    quiet = types.SimpleNamespace(_transports=[types.SimpleNamespace(peer_aborted=lambda: None)], _parent=None,
                                  _numbering=object(), parent_ranks=None, rank=1)
    assert in_call(exc, quiet) is exc


# ----- hier layouts (several nodes, several ranks each): a dead or stopped rank, every position -----------
# HPCCL_TEST_HIER_BUF=cupy runs the same cases on GPU buffers (tests/scripts/hier_die.py, BUF=cupy; the GPU
# machine's variant, never set in CI)
_HIER_BUF = __import__("os").environ.get("HPCCL_TEST_HIER_BUF", "numpy")


def _hier_run(tmp_path, n: int, victim: int, mode: str, timeout: float):
    """n ranks as 2-rank nodes (split:2) over a directory store; the victim SIGKILLs or SIGSTOPs itself inside
    a loop of hierarchical collectives (the collective in flight differs with the victim: KILL_AFTER); returns
    (rows of the survivors, the victim's exit code, the time the victim went, every rank's output)."""
    env = {"HPCCL_TIMEOUT": str(timeout), "HPCCL_NODE_ID": "split:2", "HPCCL_ALGO": "hier", "VICTIM": str(victim),
           "MODE": mode, "KILL_AFTER": str(5 + victim), "BUF": _HIER_BUF}
    procs = start_plain(n, "tests/scripts/hier_die.py", tmp_path, env)
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except Exception:  # noqa: BLE001 - a hang: end every rank (each by its own pid), then fail below
            for q in procs:
                if q.poll() is None:
                    q.kill()
            outs.append(p.communicate()[0] + "\n(killed by the test: it hung)")
    mark = tmp_path / "victim_at"
    assert mark.exists(), ("the victim never reached its kill point (a rank failed before it); every rank's output:\n"
                           + "\n".join(f"--- rank {r} (exit {p.returncode}):\n{o[-3000:]}"
                                        for r, (p, o) in enumerate(zip(procs, outs))))
    at = float(mark.read_text())
    rows = {row["rank"]: row for r, out in enumerate(outs) if r != victim for row in results(out)}
    return rows, procs[victim].returncode, at, outs, [p.returncode for p in procs]


def _nothing_left(script: str = "tests/scripts/hier_die.py") -> None:
    import subprocess
    assert shm_leftovers() == [], shm_leftovers()
    left = subprocess.run(["pgrep", "-f", script], capture_output=True, text=True).stdout
    assert left.strip() == "", left


@pytest.mark.skipif(not _ENGINE, reason=_NO_ENGINE)
@pytest.mark.parametrize("n,victim", [(4, v) for v in range(4)] + [(6, v) for v in range(6)])
def test_hier_dead_rank_is_named_by_every_survivor(n, victim, tmp_path):
    """2 and 3 nodes of 2 ranks (the network engine between them), every victim position, a loop of
    all_reduce, all_gather, reduce_scatter, broadcast and reduce: the victim SIGKILLs itself between calls.
    Every survivor raises HpcclRemoteError within 3 s (HPCCL_TIMEOUT is 30 s) naming the dead rank in the
    user's numbering (exc.rank and the message), whether it saw the death itself (its process gone on this
    node, its connection lost) or heard of it through the abort of a peer, on its node or across the network,
    and in whichever step (intra, inter) of whichever call it waited. Nothing is left in /dev/shm or running."""
    rows, code, at, outs, codes = _hier_run(tmp_path, n, victim, "kill", 30)
    assert code == -9, outs[victim][-2000:]
    assert sorted(rows) == [r for r in range(n) if r != victim], outs
    for r, row in rows.items():
        assert row.get("error") == "HpcclRemoteError" and row["failed"] == victim, (r, row)
        assert f"rank {victim} " in row["message"], (r, row)
        # host buffers: the step that met it is named; on GPU buffers the death is mostly seen by the node's
        # watch while synchronize waits on the GPU, after the call (and its steps) were enqueued
        assert _HIER_BUF == "cupy" or "hierarchical step" in row["message"], (r, row)
        assert row["at"] - at < 3.0, (r, row, row["at"] - at)
        assert codes[r] == 0, outs[r][-2000:]
    _nothing_left()
    print(f"{n} ranks, rank {victim} killed: slowest survivor {max(row['at'] for row in rows.values()) - at:.2f} s")


@pytest.mark.skipif(not _ENGINE, reason=_NO_ENGINE)
@pytest.mark.parametrize("victim", [1, 2])
def test_hier_stopped_rank_is_named_by_every_survivor(victim, tmp_path):
    """2 nodes x 2 ranks, a rank SIGSTOPped between calls (local rank 1 of node 0; local rank 0 of node 1):
    every survivor raises within HPCCL_TIMEOUT + 3 s naming it in the user's numbering, as the rank that
    never came to the user's call (HpcclTimeoutError.missing) or as the rank a timed-out peer's abort names;
    never a survivor that was only waiting on it, in another step, nor a rank of a sub-communicator's
    numbering. The stopped rank is let go once all have reported; nothing is left in /dev/shm or running."""
    timeout = 2.0
    rows, code, at, outs, codes = _hier_run(tmp_path, 4, victim, "stop", timeout)
    assert sorted(rows) == [r for r in range(4) if r != victim], outs
    for r, row in rows.items():
        assert row.get("error") in ("HpcclTimeoutError", "HpcclRemoteError"), (r, row)
        if row["error"] == "HpcclTimeoutError":
            assert row["missing"] == [victim] and f"rank(s) [{victim}]" in row["message"], (r, row)
        else:
            assert row["failed"] == victim and f"rank {victim} " in row["message"], (r, row)
        assert row["at"] - at < timeout + 3.0, (r, row, row["at"] - at)
    assert all(c == 0 for c in codes), (codes, outs)
    _nothing_left()
    print(f"rank {victim} stopped: survivors raised {min(row['at'] for row in rows.values()) - at:.2f}-"
          f"{max(row['at'] for row in rows.values()) - at:.2f} s after")
