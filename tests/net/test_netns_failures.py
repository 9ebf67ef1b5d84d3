"""A rank lost between separate hosts (network namespaces, one rank each, 2 and 3 hosts), over hpccl's
native network engine with UCX's DEFAULT transports (UCX_TLS unset): every survivor must name the lost rank.

  * SIGKILL in the middle of a loop of all_reduce (8 B and 4 MiB): HpcclRemoteError naming it within 3 s
    of the kill, with HPCCL_TIMEOUT=60 (only failure detection explains a fast error);
  * SIGSTOP: an HpcclTimeoutError or HpcclRemoteError naming it within HPCCL_TIMEOUT (5 s) + a few
    seconds; after SIGCONT the stopped rank fails too and exits;
  * its host's veth set down: an error naming it within HPCCL_TIMEOUT + a few seconds.

Ranks are plain processes (tests/scripts/net_fail.py over a directory store) inside the host namespaces:
no launcher tears the survivors down when a rank dies. Each rank prints its error with a CLOCK_MONOTONIC
timestamp, compared with the moment the test acted. After every case no rank process is left (in any
host namespace) and nothing of hpccl's is left in /dev/shm. Needs root (ip netns) and the engine's UCX."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List

import pytest

from nethosts import ROOT, Hosts, ensure_iproute2, ensure_libucx, start_on_hosts
from mpirun import results

SCRIPT = "tests/scripts/net_fail.py"
#: removed from the ranks' environment: UCX picks its own transports and devices, hpccl its own net path
UNSET = ["UCX_TLS", "HPCCL_UCX_TLS", "UCX_NET_DEVICES", "HPCCL_NET", "HPCCL_TRANSPORT"]
VICTIM = 1  # in the middle of the ring with 3 hosts; the last rank with 2
KILL_BOUND_S = 3.0
SLACK_S = 3.0  # "a few seconds" past HPCCL_TIMEOUT: the timed-out rank's survey of its peers, load
SIZES = [8, 4 << 20]
NS = [2, 3]
CASES = [(n, b) for n in NS for b in SIZES]
IDS = [f"{n}hosts-{'8B' if b == 8 else '4MiB'}" for n, b in CASES]
TIMES: Dict[str, Dict[int, float]] = {}  # measured detection times, printed at the end of the module


def _engine_available() -> None:
    probe = [sys.executable, "-c", "import hpccl.transport.engine"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if subprocess.run(probe, capture_output=True, cwd="/", env=env).returncode != 0:
        ensure_libucx()  # installs the libucx wheel the engine loads, if missing
        r = subprocess.run(probe, capture_output=True, text=True, cwd="/", env=env)
        if r.returncode != 0:
            pytest.skip(f"hpccl's network engine does not load here: {r.stderr.strip()[-400:]}")


@pytest.fixture
def hosts():
    """3 fresh host namespaces per test (a link test takes one down)."""
    ensure_iproute2()
    _engine_available()
    h = Hosts(3, prefix=f"hf{os.getpid() % 100000}")
    try:
        yield h.create()
    finally:
        h.destroy()


def _hpccl_shm() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith("hpccl-")} if os.path.isdir("/dev/shm") else set()


def _alive(procs: List[subprocess.Popen]) -> List[int]:
    return [r for r, p in enumerate(procs) if p.poll() is None]


class Run:
    """n ranks of net_fail.py on hosts 0..n-1, started and waited for in the loop."""

    def __init__(self, hosts: Hosts, n: int, nbytes: int, timeout: float, store) -> None:
        self.hosts, self.n = hosts, n
        self.shm_before = _hpccl_shm()
        store.mkdir()
        self.store = store
        self.procs = start_on_hosts(hosts, n, 1, [SCRIPT, str(nbytes)], store,
                                    env={"HPCCL_TIMEOUT": str(timeout), "UCX_WARN_UNUSED_ENV_VARS": "n"},
                                    unset=UNSET)
        self.outs: Dict[int, str] = {}
        self.codes: Dict[int, int] = {}
        self.info = self._ready()

    def _ready(self) -> Dict[int, dict]:
        deadline = time.monotonic() + 180  # init of n Pythons on a loaded 2-core machine
        while not all((self.store / f"ready{r}").exists() for r in range(self.n)):
            dead = [r for r, p in enumerate(self.procs) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.finish(0)
                pytest.fail(f"rank(s) {dead or 'some'} did not reach the loop:\n" + self.dump())
            time.sleep(0.02)
        info = {r: json.loads((self.store / f"ready{r}").read_text()) for r in range(self.n)}
        for r, row in info.items():
            assert row["pid"] == self.procs[r].pid, (row, self.procs[r].pid)  # Popen's pid is the rank
            assert row["host"] == self.hosts.names[r] and row["num_nodes"] == self.n, row
            assert "ucx/engine" in row["transports"], row  # the native engine between the hosts
            assert row["UCX_TLS"] is None and row["tls"] == "all" and row["error_handling"], row
        return info

    def wait(self, ranks: List[int], seconds: float) -> List[int]:
        """Wait up to ``seconds`` for ``ranks`` to exit; return the ones still running."""
        deadline = time.monotonic() + seconds
        for r in ranks:
            try:
                self.procs[r].wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [r for r in ranks if self.procs[r].poll() is None]

    def finish(self, seconds: float) -> List[int]:
        """Give every rank ``seconds`` to exit, then SIGCONT + SIGKILL the rest; collect every output.
        Returns the ranks that had to be killed."""
        left = self.wait(list(range(self.n)), seconds)
        for r in left:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.procs[r].pid, sig)
                except ProcessLookupError:
                    pass
        for r, p in enumerate(self.procs):
            if r not in self.outs:
                self.outs[r] = p.communicate(timeout=60)[0]
                self.codes[r] = p.returncode
        return left

    def rows(self) -> Dict[int, dict]:
        return {row["rank"]: row for out in self.outs.values() for row in results(out)}

    def dump(self) -> str:
        for r, p in enumerate(self.procs):
            if r not in self.outs and p.poll() is not None:
                self.outs[r] = p.communicate()[0]
                self.codes[r] = p.returncode
        return "\n".join(f"--- rank {r} (exit {self.codes.get(r)}):\n{out[-2500:]}"
                         for r, out in sorted(self.outs.items()))

    def check_nothing_left(self) -> None:
        """No rank process anywhere (in the host namespaces or by name), no new hpccl file in /dev/shm."""
        assert _alive(self.procs) == [], self.dump()
        for i in range(self.n):
            assert self.hosts.pids(i) == [], (self.hosts.names[i], self.hosts.pids(i))
        left = subprocess.run(["pgrep", "-f", SCRIPT], capture_output=True, text=True).stdout.strip()
        assert left == "", left
        deadline = time.monotonic() + 5  # a concurrent test's own segments come and go: only persistent ones count
        while (new := _hpccl_shm() - self.shm_before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert new == set(), new


def _survivor_checks(run: Run, t_act: float, bound: float, kinds: tuple, key: str) -> Dict[int, float]:
    rows = run.rows()
    late: Dict[int, float] = {}
    for r in range(run.n):
        if r == VICTIM:
            continue
        assert r in rows, f"survivor {r} printed no error record:\n" + run.dump()
        row = rows[r]
        assert row["error"] in kinds, (row, run.dump())
        if row["error"] == "HpcclTimeoutError":
            assert row["missing"] == [VICTIM], row
        else:
            assert row["failed"] == VICTIM, row
        assert f"{VICTIM}" in row["message"], row
        assert row["done"] > 1, row  # it was in the loop, past its first call
        late[r] = row["at"] - t_act
    TIMES[key] = late
    print(f"{key}: survivors' errors {', '.join(f'rank {r} {s:.3f}s' for r, s in late.items())} after the act; "
          f"errors {[(r, rows[r]['error']) for r in late]}")
    for r, s in late.items():
        assert 0 <= s < bound, (f"rank {r} raised {s:.3f}s after the act (bound {bound}s)", rows[r])
    return late


@pytest.mark.parametrize("n,nbytes", CASES, ids=IDS)
def test_sigkill_is_named_by_every_survivor_within_3s(hosts, n, nbytes, tmp_path, request):
    run = Run(hosts, n, nbytes, 60, tmp_path / "store")
    try:
        time.sleep(0.5)  # well inside the loop
        assert _alive(run.procs) == list(range(n)), run.dump()
        t_kill = time.monotonic()
        os.kill(run.info[VICTIM]["pid"], signal.SIGKILL)
        killed = run.finish(30)
    finally:
        run.finish(0)
    assert killed == [], (f"rank(s) {killed} still running 30 s after the kill", run.dump())
    assert run.codes[VICTIM] == -9, run.dump()
    assert all(run.codes[r] == 0 for r in range(n) if r != VICTIM), run.dump()
    _survivor_checks(run, t_kill, KILL_BOUND_S, ("HpcclRemoteError",), request.node.callspec.id + " SIGKILL")
    assert all("DESTROYED" in run.outs[r] for r in range(n) if r != VICTIM), run.dump()
    run.check_nothing_left()


@pytest.mark.parametrize("n,nbytes", CASES, ids=IDS)
def test_sigstop_is_named_within_the_timeout(hosts, n, nbytes, tmp_path, request):
    timeout = 5.0
    run = Run(hosts, n, nbytes, timeout, tmp_path / "store")
    victim = run.procs[VICTIM]
    try:
        time.sleep(0.5)
        t_stop = time.monotonic()
        os.kill(victim.pid, signal.SIGSTOP)
        stuck = run.wait([r for r in range(n) if r != VICTIM], timeout + 30)
        os.kill(victim.pid, signal.SIGCONT)  # it resumes into a communicator whose peers are gone
        t_cont = time.monotonic()
        resumed_stuck = run.wait([VICTIM], timeout + 15)
        t_exit = time.monotonic()
    finally:
        run.finish(0)
    assert stuck == [], (f"survivor(s) {stuck} still running {timeout + 30:g} s after the stop", run.dump())
    assert all(run.codes[r] == 0 for r in range(n) if r != VICTIM), run.dump()
    _survivor_checks(run, t_stop, timeout + SLACK_S, ("HpcclTimeoutError", "HpcclRemoteError"),
                     request.node.callspec.id + " SIGSTOP")
    assert resumed_stuck == [], (f"the resumed rank still ran {timeout + 15:g} s after SIGCONT", run.dump())
    row = run.rows().get(VICTIM)
    assert row is not None and row["error"] and row["error"].startswith("Hpccl"), run.dump()
    assert run.codes[VICTIM] == 0, run.dump()
    print(f"resumed rank: {row['error']} {row['at'] - t_cont:.3f}s after SIGCONT, exited after "
          f"{t_exit - t_cont:.3f}s: {row['message'][:200]}")
    run.check_nothing_left()


@pytest.mark.parametrize("n,nbytes", CASES, ids=IDS)
def test_link_down_is_named_within_the_timeout(hosts, n, nbytes, tmp_path, request):
    timeout = 5.0
    run = Run(hosts, n, nbytes, timeout, tmp_path / "store")
    try:
        time.sleep(0.5)
        t_down = time.monotonic()
        hosts.link(VICTIM, up=False)
        stuck = run.wait([r for r in range(n) if r != VICTIM], timeout + 30)
        cut_stuck = run.wait([VICTIM], timeout + 15)  # the cut-off rank times out too, alone
        t_exit = time.monotonic()
    finally:
        run.finish(0)
        hosts.link(VICTIM, up=True)
    assert stuck == [], (f"survivor(s) {stuck} still running {timeout + 30:g} s after the link went down",
                         run.dump())
    assert all(run.codes[r] == 0 for r in range(n) if r != VICTIM), run.dump()
    _survivor_checks(run, t_down, timeout + SLACK_S, ("HpcclTimeoutError", "HpcclRemoteError"),
                     request.node.callspec.id + " link down")
    assert cut_stuck == [], (f"the cut-off rank still ran {t_exit - t_down:.1f} s after its link went down",
                             run.dump())
    row = run.rows().get(VICTIM)
    assert row is not None and row["error"] and row["error"].startswith("Hpccl"), run.dump()
    assert run.codes[VICTIM] == 0, run.dump()
    print(f"cut-off rank: {row['error']} {row['at'] - t_down:.3f}s after the link went down, exited after "
          f"{t_exit - t_down:.3f}s: {row['message'][:200]}")
    run.check_nothing_left()


def teardown_module(module):
    for key, late in TIMES.items():
        print(f"detection {key}: " + ", ".join(f"rank {r} {s:.3f}s" for r, s in late.items()))
