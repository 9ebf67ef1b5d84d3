"""Runs slurm/hpccl-cpu.sbatch under a real one-node Slurm (slurmctld + slurmd + munged on localhost)."""
import os
import subprocess
import time

import pytest

from conftest import REPO, VENV_BIN, apt_ensure, dpkg_installed, hpccl_importable, which
from perfparse import parse, wrong_rows
from slurmlocal import BINARIES, PACKAGES, LocalSlurm

SIZES = [8 * 4 ** k for k in range(10) if 8 * 4 ** k <= 1 << 20]  # -b 8 -e 1M -f 4


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (SlurmUser=root, munged key)")
    apt_ensure(PACKAGES, lambda: all(which(b) for b in BINARIES) and dpkg_installed("libpmix-dev"))
    with LocalSlurm() as cluster:
        yield cluster


def _shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def test_srun_offers_pmi2_and_pmix(slurm):
    r = slurm.run(["srun", "--mpi=list"])
    text = r.stdout + r.stderr
    assert "pmi2" in text and "pmix" in text, text


def test_sbatch_directives_are_known(slurm):
    """Every #SBATCH option in slurm/*.sbatch is one this sbatch knows."""
    help_text = slurm.run(["sbatch", "--help"]).stdout
    for path in sorted((REPO / "slurm").glob("*.sbatch")):
        for line in path.read_text().splitlines():
            if line.startswith("#SBATCH "):
                opt = line.split()[1].split("=")[0]
                assert opt in help_text, f"{path.name}: unknown sbatch option {opt}"


def test_cpu_template_runs_hpccl_perf(slurm, tmp_path):
    ok, why = hpccl_importable()
    assert ok, f"hpccl (with hpccl.cli.perf) must import for this test: {why}"
    shm_before = _shm_entries()
    out = tmp_path / "job-%j.out"
    env = slurm.env(PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                    SRUN_MPI="pmi2", HPCCL_TIMEOUT="60", HPCCL_DEBUG="INFO")
    cmd = ["sbatch", "--parsable", "--wait", "--nodes=1", "--ntasks-per-node=2", "--time=3",
           f"--output={out}", "--export=ALL", str(REPO / "slurm" / "hpccl-cpu.sbatch")]
    t0 = time.monotonic()
    try:
        r = slurm.run(cmd, env=env, cwd=tmp_path, timeout=100, check=False)
    finally:
        leftovers = sorted(e for e in _shm_entries() - shm_before if e.startswith(("hpccl", "mpich")))
        for e in leftovers:  # a crashed job must not leave segments behind
            try:
                os.unlink(os.path.join("/dev/shm", e))
            except OSError:
                pass
    jobid = r.stdout.strip().split(";")[0]
    logs = list(tmp_path.glob("job-*.out"))
    text = logs[0].read_text(errors="replace") if logs else "(no job output)"
    detail = f"sbatch rc={r.returncode} job={jobid} in {time.monotonic() - t0:.1f}s\n{r.stderr}\n{text}"
    assert r.returncode == 0, detail + slurm.logs()
    assert "srun --mpi=pmi2" in text and "2 ranks" in text, detail
    rows = parse(text)
    sizes = [int(row["size"]) for row in rows]
    assert sizes == SIZES, f"expected one row per size {SIZES}\n{detail}"
    assert not wrong_rows(rows), f"hpccl-perf --check found wrong results\n{detail}"
    assert not leftovers, f"the job left /dev/shm entries {leftovers} (removed now)"
