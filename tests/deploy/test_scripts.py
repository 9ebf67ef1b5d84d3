"""shellcheck passes on every shell script we ship (Slurm templates, deploy scripts, container helper)."""
import subprocess

import pytest

from deployutil import REPO, tool

SCRIPTS = sorted([*REPO.glob("slurm/*.sbatch"), *REPO.glob("slurm/*.sh"), *REPO.glob("scripts/deploy/*.sh"),
                  *REPO.glob("containers/*.sh")])
TEMPLATES = ["hpccl-1node-8gpu", "hpccl-multinode", "hpccl-pyxis", "hpccl-apptainer", "hpccl-cpu",
             "hpccl-perf-sweep"]


def test_all_templates_present():
    names = {p.stem for p in REPO.glob("slurm/*.sbatch")}
    assert set(TEMPLATES) <= names, set(TEMPLATES) - names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    sc = tool("shellcheck")
    r = subprocess.run([sc, "--shell=bash", "--external-sources", str(script)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_conventions(name):
    text = (REPO / "slurm" / f"{name}.sbatch").read_text()
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    assert 'SRUN_MPI="${SRUN_MPI:-pmix}"' in text and '--mpi="$SRUN_MPI"' in text
    assert "--cpu-bind=" in text and "--ntasks-per-node=" in text and "HPCCL_DEBUG" in text
    if name != "hpccl-cpu":
        assert "--gpus-per-node=" in text
    if name == "hpccl-pyxis":
        assert "--container-image=" in text and "--container-mounts=" in text
    if name == "hpccl-apptainer":
        assert "apptainer exec --nv" in text
    if name == "hpccl-perf-sweep":
        assert "hpccl-perf" in text

