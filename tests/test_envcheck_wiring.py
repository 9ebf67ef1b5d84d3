"""The environment checks as hpccl wires them: the /dev/shm need is counted once per rank (it was
multiplied by the local rank count twice), and hpccl-info's environment section reports a real need."""
from __future__ import annotations

import os
import types

from mpirun import run_mpi


def test_init_check_counts_the_shm_need_once_per_rank(monkeypatch):
    import hpccl.envcheck as envcheck
    from hpccl.core.comm import Communicator
    seen = {}

    def fake(need, local_size, use_gpu=False, **kw):
        seen.update(need=need, local_size=local_size, **kw)
        return []
    monkeypatch.setattr(envcheck, "check_environment", fake)
    stub = types.SimpleNamespace(local_size=4, local_rank=0, parent_ranks=None,
                                 _transports=[types.SimpleNamespace(name="shm")])
    Communicator._check_env(stub, types.SimpleNamespace(segment_bytes=12345))
    assert seen == {"need": 12345, "local_size": 4, "use_ucx": False}  # check_shm multiplies by 4 itself


def test_info_reports_a_shm_shortfall():
    st = os.statvfs("/dev/shm")
    total = st.f_blocks * st.f_frsize
    per_rank = (total // 2 + (1 << 30)) >> 20 << 20  # two ranks then need more than the whole tmpfs
    proc = run_mpi(2, ["-m", "hpccl.cli.info"], env={"HPCCL_SHM_DIRECT_SIZE": str(per_rank)}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("environment:")]
    assert lines and "/dev/shm" in lines[0] and "2 local rank(s)" in lines[0], proc.stdout[-3000:]


def test_readme_shm_figures_match_the_layout():
    """The README's /dev/shm figures (per rank at 4 ranks, per node at 4 and 8) are the layout's."""
    from pathlib import Path
    from hpccl.transport.shm import ShmTransport
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    mib = lambda n: round(ShmTransport.segment_size(n) / 2**20)  # noqa: E731
    assert f"{mib(4)} MiB per rank and {4 * mib(4)} MiB for 4 ranks, {8 * mib(8)} MiB for 8" in readme
