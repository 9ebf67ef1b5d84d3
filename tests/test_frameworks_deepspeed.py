"""Issue 36, DeepSpeed: ZeRO stage 2 and stage 3 (examples/deepspeed_zero.py) at 2 ranks under torchrun on
the CPU, hpccl against gloo: every step's loss equal, the default group's backend hpccl, and no hpccl
shared-memory file left in /dev/shm."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^step (\d+) loss (\S+)$", re.M)
BACKEND = re.compile(r"^backend (\w+) world (\d+) zero_stage (\d+)$", re.M)


def _hpccl_shm() -> set:
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if n.startswith("hpccl")}


def _run(stage: int, backend: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK",
              "PMI_SIZE"):
        env.pop(v, None)
    # the first run may JIT-build DeepSpeed's shm op (about a minute on 2 cores); later runs take ~10 s
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                        f"--master-port={port}", "examples/deepspeed_zero.py", "--stage", str(stage),
                        "--backend", backend], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    got = BACKEND.search(p.stdout)
    assert got is not None, p.stdout[-2000:]
    return [(int(s), float(x)) for s, x in STEP.findall(p.stdout)], (got.group(1), int(got.group(2)),
                                                                        int(got.group(3)))


def test_deepspeed_zero_on_hpccl_equals_gloo():
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (heavy install and op build); "
                                            "docs/perf/frameworks/deepspeed_cpu.log holds a real run")
    before = _hpccl_shm()
    for stage in (2, 3):
        h, hb = _run(stage, "hpccl")
        g, gb = _run(stage, "gloo")
        assert (hb, gb) == (("hpccl", 2, stage), ("gloo", 2, stage))
        assert len(h) == 20 and h == g, (stage, h, g)
    assert _hpccl_shm() <= before, sorted(_hpccl_shm() - before)
