"""CUDA buffers across hpccl's UCX transport (2 ranks, a GPU each): runs only where CuPy sees 2 GPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nethosts import ROOT, ensure_ucxx, mpiexec


def _gpus() -> int:
    r = subprocess.run([sys.executable, "-c", "import cupy; print(cupy.cuda.runtime.getDeviceCount())"],
                       capture_output=True, text=True)
    try:
        return int(r.stdout.strip())
    except ValueError:
        return 0


@pytest.mark.skipif(_gpus() < 2, reason="needs CuPy and 2 GPUs")
@pytest.mark.parametrize("tls", ["", "tcp,cuda_copy,self"], ids=["ucx-default", "tcp+cuda_copy"])
def test_cuda_buffers_cross_ucx(tls):
    ensure_ucxx()
    env = dict(os.environ, HPCCL_TIMEOUT="60", UCX_WARN_UNUSED_ENV_VARS="n",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if tls:
        env["UCX_TLS"] = tls
    proc = subprocess.run(mpiexec() + ["-n", "2", sys.executable, "tests/scripts/net_gpu.py"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(rows) == 2 and all(r["bad"] == [] and r["checks"] == 45 for r in rows), rows
    print(rows)
