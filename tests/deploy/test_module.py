"""The Lmod modulefile: install hpccl into a temp prefix, then 'module load hpccl' in a clean login shell."""
import os
import shutil
import subprocess
import sys

import pytest

from deployutil import REPO, VENV_BIN, apt_ensure, tool_env

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"


@pytest.fixture(scope="module")
def lmod():
    apt_ensure(["lmod"], lambda: os.path.exists(LMOD_INIT))
    return LMOD_INIT


def clean_shell(script, path="/usr/local/bin:/usr/bin:/bin", timeout=120):
    """Run ``script`` in 'env -i bash -l' (only HOME and PATH), with Lmod initialised."""
    env = ["env", "-i", f"HOME={os.environ.get('HOME', '/root')}", f"PATH={path}", "TERM=dumb"]
    # a login shell's /etc/profile resets PATH: set it again after it ran
    full = f"export PATH={path}\nsource {LMOD_INIT}\nset -e\n{script}"
    return subprocess.run(env + ["bash", "-l", "-c", full], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def check_loaded(r, prefix):
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"HPCCL_FILE={prefix}" in out, out
    assert "HPCCL_DEBUG=WARN" in out and "HPCCL_CHECK_ENV=1" in out, out
    assert "hpccl" in out and "0.1.0" in out, out


LOAD_AND_RUN = """
module use {moduleroot}
module load hpccl
module is-loaded hpccl
python -c 'import hpccl; print("HPCCL_FILE=" + hpccl.__file__)'
echo "HPCCL_DEBUG=$HPCCL_DEBUG HPCCL_CHECK_ENV=$HPCCL_CHECK_ENV HPCCL_ROOT=$HPCCL_ROOT"
hpccl-info
module help hpccl
module whatis hpccl
"""


def test_venv_install(lmod, tmp_path):
    """scripts/deploy/install-module.sh: venv prefix + filled-in modulefile, as a site would install."""
    prefix, moduleroot = tmp_path / "hpccl" / "0.1.0", tmp_path / "modulefiles"
    r = subprocess.run(["bash", str(REPO / "scripts/deploy/install-module.sh"), str(prefix),
                        str(moduleroot), f"{REPO}[mpich]"], capture_output=True, text=True,
                       timeout=600, env=tool_env(PYTHON=sys.executable))
    assert r.returncode == 0, r.stdout + r.stderr
    text = (moduleroot / "hpccl" / "0.1.0.lua").read_text()
    assert "@PREFIX@" not in text and str(prefix) in text
    r = clean_shell(LOAD_AND_RUN.format(moduleroot=moduleroot))
    check_loaded(r, prefix)
    assert "Module Specific Help" in r.stdout + r.stderr


def test_pip_prefix_install(lmod, tmp_path):
    """'pip install --prefix' tree, modulefile copied unfilled into PREFIX/share/modulefiles (finds its prefix)."""
    prefix = tmp_path / "opt" / "hpccl"
    # --ignore-installed: without it pip removes this venv's own hpccl before installing into the prefix
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
                        "--prefix", str(prefix), str(REPO)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    moduleroot = prefix / "share" / "modulefiles"
    (moduleroot / "hpccl").mkdir(parents=True)
    shutil.copy(REPO / "modulefiles" / "hpccl" / "0.1.0.lua", moduleroot / "hpccl" / "0.1.0.lua")
    # The site's python (here: this venv, giving numpy and mpi4py) is on PATH, as a python module would do.
    r = clean_shell(LOAD_AND_RUN.format(moduleroot=moduleroot), path=f"{VENV_BIN}:/usr/bin:/bin")
    check_loaded(r, prefix)
    r = clean_shell(f"module use {moduleroot}\nmodule load hpccl\nmodule unload hpccl\n"
                    "echo \"PATH=$PATH PYTHONPATH=${PYTHONPATH:-}\"")
    assert r.returncode == 0 and str(prefix) not in r.stdout, r.stdout + r.stderr
