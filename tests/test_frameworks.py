"""Issue 36: training frameworks on the hpccl backend, each checked against gloo at 2 ranks on the CPU
(every step's loss equal): PyTorch Lightning (its own process start, DDPStrategy(process_group_backend=
"hpccl")) and Hugging Face accelerate (under torchrun, hpccl.torch.init_process_group() before
Accelerator()). scripts/setup.sh installs both."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^step (\d+) loss (\S+)$", re.M)


def _run(args, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK", "PMI_SIZE"):
        env.pop(v, None)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    _wait_for_group(p.pid)
    assert p.returncode == 0, (out + err)[-4000:]
    losses = STEP.findall(out)
    backend = re.search(r"^backend (\w+) world (\d+)", out, re.M)
    assert backend is not None, out[-2000:]
    return [(int(s), float(x)) for s, x in losses], backend.group(1), int(backend.group(2))


def _wait_for_group(pgid: int, limit: float = 30.0) -> None:
    """Wait until every process of the run's process group has ended: Lightning's first process returns without
    waiting for the second it started, which then still holds MPI's shared memory (Lightning's environment
    check initialises MPI) for a moment. Killed after ``limit`` seconds, and the test fails."""
    end = time.monotonic() + limit
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > end:
            os.killpg(pgid, signal.SIGKILL)
            raise AssertionError(f"processes of the run (process group {pgid}) still running {limit:.0f} s after it ended")
        time.sleep(0.05)


def _gloo(make_args):
    """The gloo baseline, run again once if it failed: gloo's own teardown aborted once after the run's
    output was complete ("terminate called without an active exception" from torch's C++ at exit, CI
    2026-12-04), which is not what these tests check. hpccl's runs are never run again."""
    try:
        return _run(make_args())
    except AssertionError as exc:
        print(f"the gloo baseline failed, run once more: {str(exc)[-400:]}", flush=True)
        return _run(make_args())


def _torchrun():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}"]


def test_lightning_ddp_on_hpccl_equals_gloo():
    pytest.importorskip("lightning", reason="lightning is not installed (scripts/setup.sh installs it)")
    args = lambda b: [sys.executable, "examples/lightning_ddp.py", "--devices", "2", "--backend", b]  # noqa: E731
    got = {"hpccl": _run(args("hpccl")), "gloo": _gloo(lambda: args("gloo"))}
    (h, hb, hw), (g, gb, gw) = got["hpccl"], got["gloo"]
    assert (hb, hw, gb, gw) == ("hpccl", 2, "gloo", 2)
    assert len(h) == 20 and h == g, (h, g)


def test_accelerate_under_torchrun_on_hpccl_equals_gloo():
    pytest.importorskip("accelerate", reason="accelerate is not installed (scripts/setup.sh installs it)")
    args = lambda b: _torchrun() + ["examples/accelerate_train.py", "--backend", b]  # noqa: E731
    got = {"hpccl": _run(args("hpccl")), "gloo": _gloo(lambda: args("gloo"))}
    (h, hb, hw), (g, gb, gw) = got["hpccl"], got["gloo"]
    assert (hb, hw, gb, gw) == ("hpccl", 2, "gloo", 2)
    assert len(h) == 20 and h == g, (h, g)


def test_init_process_group_without_a_launcher_is_a_world_of_one():
    """hpccl.torch.init_process_group() in a plain process (no MPI launcher, no torchrun variables)."""
    code = ("import hpccl.torch as ht, torch, torch.distributed as dist\n"
            "ht.init_process_group()\n"
            "t = torch.ones(3); dist.all_reduce(t)\n"
            "print('backend', dist.get_backend(), 'world', dist.get_world_size(), t.tolist())\n"
            "dist.destroy_process_group()\n")
    losses, backend, world = _run([sys.executable, "-c", code], timeout=120)
    assert (backend, world) == ("hpccl", 1)
