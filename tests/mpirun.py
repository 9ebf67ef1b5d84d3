"""Shared test helpers: launching a script or a pytest file under mpiexec with a bound on its time,
reading the records scripts print, reading a pytest sub-suite's summary (its skips reach the top-level
run's summary through tests/conftest.py), and checking /dev/shm."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

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


def shm_in_use(names: Sequence[str]) -> set:
    """Those of the /dev/shm ``names`` another live process still maps or holds open (read from /proc; this
    process's own use does not count: removing the name leaves its mapping intact)."""
    paths = {f"/dev/shm/{n}": n for n in names}
    used: set = set()
    for pid in (d for d in os.listdir("/proc") if d.isdigit() and int(d) != os.getpid()):
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # the process ended, or is not ours to read
            continue
        used.update(n for p, n in paths.items() if p in maps or p in fds)
    return used


def _unlink(names: Sequence[str]) -> None:
    for f in names:
        try:
            os.unlink(os.path.join("/dev/shm", f))
        except OSError:
            pass


def remove_mpi_leftovers(before: set, busy: Optional[set] = None) -> List[str]:
    """MPI libraries leave their own segments behind when a test kills a rank on purpose; remove the
    ones that appeared during the test (never hpccl's: those must not exist) and that no other live process
    still uses, and return their names. Those still in use (another test run's running job, or a rank of
    this test that has not yet exited) are added to ``busy``, for remove_unused() later."""
    new = [f for f in shm_snapshot() - before if f.startswith(("mpich_shm_", "sm_segment", "psm"))]
    if new:
        held = shm_in_use(new)
        if busy is not None:
            busy.update(held)
        new = [f for f in new if f not in held]
    _unlink(new)
    return new


def remove_unused(names: Sequence[str]) -> List[str]:
    """Remove those of ``names`` (segments remove_mpi_leftovers() found in use) that still exist and that no
    other live process uses now; return them."""
    present = [n for n in names if os.path.exists(os.path.join("/dev/shm", n))]
    held = shm_in_use(present) if present else set()
    gone = [n for n in present if n not in held]
    _unlink(gone)
    return gone


def results(stdout: str) -> List[dict]:
    """Every 'RESULT {json}' record a script printed (ranks' lines may interleave)."""
    import json
    dec, out, i = json.JSONDecoder(), [], stdout.find("RESULT ")
    while i >= 0:
        obj, end = dec.raw_decode(stdout, i + 7)
        out.append(obj)
        i = stdout.find("RESULT ", end)
    return out


# A pytest sub-suite run under mpiexec (every rank runs the same tests). -rs: every skip's reason is printed
# ("SKIPPED [n] file:line: reason"), which check_sub_suite reads back.
PYTEST_MPI_ARGS = ["-m", "pytest", "-q", "-rs", "-x", "-p", "no:cacheprovider", "-o", "python_files=mpi_*.py"]

SUB_SUITE_PROPERTY = "sub_suite"  # the user_properties name tests/conftest.py reports from
_pending: List[dict] = []  # recorded during a test; tests/conftest.py moves them onto the test's report

_OUTCOMES = r"(?:passed|failed|skipped|errors?|xfailed|xpassed|warnings?|deselected|rerun)"
_SUMMARY = re.compile(rf"((?:\d+ {_OUTCOMES}, )*\d+ {_OUTCOMES}) in \d+(?:\.\d+)?s")
_SKIP = re.compile(r"SKIPPED \[(\d+)\] (\S+?:\d+): (.*)")


def parse_pytest_summary(text: str) -> Tuple[List[Dict[str, int]], List[Tuple[int, str, str]]]:
    """Every final summary line of a pytest run ("9 passed, 1 skipped in 0.98s": one per rank under
    mpiexec, lines of ranks may interleave) as {outcome: count}, and the skips its -rs lines give as
    (count, 'file:line', reason), de-duplicated across ranks (each rank prints its own: the largest count)."""
    summaries = []
    for m in _SUMMARY.finditer(text):
        counts: Dict[str, int] = {}
        for part in m.group(1).split(", "):
            k, word = part.split(" ")
            word = {"error": "errors", "warning": "warnings"}.get(word, word)
            counts[word] = counts.get(word, 0) + int(k)
        summaries.append(counts)
    skips: Dict[Tuple[str, str], int] = {}
    for line in text.splitlines():
        m = _SKIP.search(line)
        if m:
            key = (m.group(2), m.group(3).strip())
            skips[key] = max(skips.get(key, 0), int(m.group(1)))
    return summaries, [(n, where, reason) for (where, reason), n in sorted(skips.items())]


def record_sub_suite(suite: str, ran: int, skipped: int, skips: Sequence[Tuple[int, str, str]],
                     passed: Optional[int] = None) -> None:
    """Put a sub-suite's skips (count, where, reason) in the top-level run's summary (tests/conftest.py's
    "sub-suite skips" section), on the report of the test that calls this."""
    _pending.append(dict(suite=suite, ran=ran, passed=ran - skipped if passed is None else passed,
                         skipped=skipped, skips=[list(s) for s in skips]))


def check_sub_suite(proc: subprocess.CompletedProcess, suite: str, ranks: int = 1) -> dict:
    """Check a pytest sub-suite's run (stdout and stderr merged, as run_mpi gives): it exited 0, no rank
    reports a failure or an error, and at least one test ran and passed; its skips, with their reasons,
    are recorded for the top-level summary. Returns what was recorded."""
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    summaries, skips = parse_pytest_summary(out)
    assert summaries, f"{suite}: no pytest summary line in its output\n" + out[-3000:]
    assert len(summaries) <= ranks, f"{suite}: {len(summaries)} summaries from {ranks} ranks\n" + out[-3000:]
    for key in ("failed", "errors", "xpassed"):
        assert not any(s.get(key) for s in summaries), f"{suite}: {key} in {summaries}\n" + out[-6000:]
    passed = min(s.get("passed", 0) for s in summaries)  # every rank ran the same tests
    skipped = max(s.get("skipped", 0) for s in summaries)
    assert passed > 0, f"{suite}: no test passed ({summaries})\n" + out[-3000:]
    described = sum(n for n, _, _ in skips)
    if described < skipped:  # a reason line lost in the ranks' interleaved output
        skips.append((skipped - described, "?", "(no reason line read from the output)"))
    record_sub_suite(suite, passed + skipped, skipped, skips, passed=passed)
    return _pending[-1]


def run_pytest_mpi(n: int, paths: List[str], suite: str, env: Optional[Dict[str, str]] = None,
                   timeout: float = 900, extra: Sequence[str] = ()) -> dict:
    """Run pytest on paths on n ranks (PYTEST_MPI_ARGS), check the run (check_sub_suite) and return its
    summary: passed, skipped, skips."""
    proc = run_mpi(n, PYTEST_MPI_ARGS + list(extra) + list(paths), env=env, timeout=timeout)
    return check_sub_suite(proc, suite, ranks=n)


def start_plain(n: int, script: str, store_dir, env: Optional[Dict[str, str]] = None) -> List[subprocess.Popen]:
    """Start ``python script`` as n plain processes (no MPI launcher, so none tears the others down when one
    dies), bootstrapped over a directory store: RANK, SIZE and STORE_DIR set, MPI launcher variables
    removed; stdout and stderr merged."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PMIX", "MPI_"))}
    e.update(SIZE=str(n), STORE_DIR=str(store_dir), PYTHONPATH=str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""))
    e.update(env or {})
    return [subprocess.Popen([sys.executable, script], cwd=ROOT, env=dict(e, RANK=str(r)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for r in range(n)]
