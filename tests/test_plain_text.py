"""Issue 37: what hpccl prints is plain text. Open MPI's MPI.Get_library_version() ends with a NUL byte,
which hpccl-perf's header and hpccl-info's MPI line kept, so `| grep` took the whole output for binary.
Every string from MPI, CUDA, NVML or UCX now goes through hpccl/text.py before it is printed or logged;
here a stand-in library version carrying NUL, escape and other control characters (and a host name with
a bell in it) goes through both CLIs and a log line, and their output must be text."""
from __future__ import annotations

import os
import subprocess
import sys

from hpccl.text import block, clean, one_line, plain

DIRTY = "Open MPI v4.1.6, package: Debian OpenMPI\x1b[31m red\x1b[0m\tident: 4.1.6\x00\r\nsecond line\x00\n"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_helpers_keep_text_and_drop_controls():
    assert one_line(DIRTY) == "Open MPI v4.1.6, package: Debian OpenMPI red ident: 4.1.6"
    assert one_line(DIRTY.encode()) == one_line(DIRTY)  # bytes, as NVML and ctypes hand them
    assert plain(DIRTY) == "Open MPI v4.1.6, package: Debian OpenMPI red ident: 4.1.6 | second line"
    assert clean("rank \u202eevil\x7f\x9b1") == "rank evil1"  # bidi override, DEL, a C1 control
    assert block("  GPUs: 1\n    GPU0: H200\x00\n\n  x") == "  GPUs: 1\n    GPU0: H200\n\n  x"
    assert one_line("") == "" and one_line("\x00\n") == ""


def _is_text(out: bytes) -> None:
    bad = sorted({b for b in out if b < 0x20 and b not in (0x0A,)} | ({0x7F} & set(out)))
    assert not bad, f"control bytes {bad} in the output:\n{out[:2000]!r}"
    out.decode("utf-8")  # and valid UTF-8


def _run(code: str) -> bytes:
    stub = ("import mpi4py.MPI as MPI, socket\n"
            f"MPI.Get_library_version = lambda: {DIRTY!r}\n"
            "socket.gethostname = lambda: 'node\\x07-1'\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HPCCL_DEBUG", None)
    p = subprocess.run([sys.executable, "-c", stub + code], capture_output=True, env=env, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return p.stdout + p.stderr


def test_hpccl_info_prints_plain_text():
    out = _run("from hpccl.cli.info import main; main([])")
    _is_text(out)
    assert b"MPI        Open MPI v4.1.6, package: Debian OpenMPI red ident: 4.1.6\n" in out
    assert b"this host node-1:" in out


def test_hpccl_perf_prints_plain_text_that_grep_takes():
    out = _run("from hpccl.cli.perf import main; main(['all_reduce', '-b', '8', '-e', '64', '--check'])")
    _is_text(out)
    assert b"MPI Open MPI v4.1.6, package: Debian OpenMPI red ident: 4.1.6\n" in out
    grep = subprocess.run(["grep", "all_reduce"], input=out, capture_output=True)
    assert grep.returncode == 0 and b"binary file" not in grep.stdout + grep.stderr, grep.stdout + grep.stderr
    assert b"# Out of bounds values : 0 OK" in out


def test_a_log_line_is_one_plain_line():
    env = dict(os.environ, HPCCL_DEBUG="WARN", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("from hpccl import log\n"
            "log.warn('TRANSPORT', 'UCX said: %s', 'endpoint\\x00 closed\\x1b[1m\\nby peer')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    _is_text(p.stderr)
    lines = [x for x in p.stderr.decode().splitlines() if "UCX said" in x]
    assert len(lines) == 1 and lines[0].endswith("UCX said: endpoint closed | by peer"), p.stderr


def test_hpccl_trace_summary_of_a_file_with_a_dirty_host_prints_text(tmp_path):
    import json
    (tmp_path / "hpccl-trace-0.json").write_text(json.dumps(
        {"traceEvents": [], "otherData": {"rank": 0, "size": 1, "host": "n\x00ode\x1b[2J"}}))
    p = subprocess.run([sys.executable, "-m", "hpccl.cli.trace", "summary", str(tmp_path)], capture_output=True, timeout=60,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    _is_text(p.stdout + p.stderr)
    assert b"node" in p.stdout, p.stdout + p.stderr
