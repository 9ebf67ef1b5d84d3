"""containers/: the hpccm recipe renders exactly the committed Dockerfile and Apptainer definition,
the Dockerfile passes hadolint, and the image has what the issue asks for."""
import re
import subprocess

import pytest

from deployutil import REPO, tool

C = REPO / "containers"


def render(fmt):
    hpccm = tool("hpccm")
    extra = ["--singularity-version", "3.8"] if fmt == "singularity" else []
    r = subprocess.run([hpccm, "--recipe", str(C / "hpccl.py"), "--format", fmt, *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("fmt,name", [("docker", "Dockerfile"), ("singularity", "hpccl.def")])
def test_committed_files_match_recipe(fmt, name):
    assert render(fmt) == (C / name).read_text(), \
        f"containers/{name} drifted from containers/hpccl.py: run containers/generate.sh and commit"


def test_hadolint():
    hadolint = tool("hadolint")
    r = subprocess.run([hadolint, "--no-color", "--config", str(C / "hadolint.yaml"), str(C / "Dockerfile")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_content():
    d = (C / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)(?: AS (\S+))?", d, re.M)
    assert froms[0][0].startswith("nvcr.io/nvidia/cuda:") and froms[0][0].endswith(
        "-devel-ubuntu24.04") and froms[0][1] == "build"
    assert "-runtime-" in froms[-1][0] and len(froms) == 2
    ucx = next(line for line in d.splitlines() if "ucx-" in line and "./configure" in line)
    for flag in ("--with-cuda", "--with-gdrcopy", "--with-verbs", "--with-rdmacm", "--with-mlx5-dv"):
        assert flag in ucx, flag
    ompi = next(line for line in d.splitlines() if "openmpi-" in line and "./configure" in line)
    for flag in ("--with-ucx=", "--with-pmix=", "--with-cuda"):
        assert flag in ompi, flag
    assert "[cuda,ucx]" in d and "--no-binary=mpi4py" in d
    runtime = d.split("\nFROM ")[-1]
    for env in ("OMPI_MCA_pml=ucx", "HPCCL_NET=ucx", "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true"):
        assert env in runtime, env
    assert "ENTRYPOINT" not in d  # commands given to docker run / srun --container-image run as is


def test_build_context_files_exist():
    """Every COPY source (relative to the repository root, the build context) exists."""
    d = (C / "Dockerfile").read_text()
    for m in re.finditer(r"^COPY (?!--from)((?:.*\\\n)*.*)$", d, re.M):
        words = m.group(1).replace("\\\n", " ").split()
        for src in words[:-1]:
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"


def test_apptainer_definition():
    text = (C / "hpccl.def").read_text()
    assert text.count("BootStrap: docker") == 2 and "Stage: build" in text
    assert "%files from build" in text and "%runscript" in text
    assert "export OMPI_MCA_pml=ucx" in text


def test_recipe_versions_are_userargs():
    """--userarg changes versions (sites pin their own CUDA/UCX/Open MPI)."""
    r = subprocess.run([tool("hpccm"), "--recipe", str(C / "hpccl.py"), "--userarg", "cuda=12.8.1",
                        "ucx=1.19.0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "cuda:12.8.1-devel" in r.stdout and "ucx-1.19.0" in r.stdout and "cuda-nvrtc-dev-12-8" in r.stdout
