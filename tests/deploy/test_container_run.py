"""The container image built and run for real (issue 13): podman builds the CPU image that the hpccm recipe
renders for a plain Debian base (containers/hpccl.py, --userarg base=...), from a base made here with
debootstrap (no registry pull; cached as localhost/debian:bookworm between runs on one machine), then runs
hpccl-info and a 2-rank hpccl-perf sweep with --check inside it, and checks the image is lean (no
compiler, no pip cache in the final stage) and its size."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deployutil import REPO, apt_ensure, tool

BASE = "localhost/debian:bookworm"
IMAGE = "localhost/hpccl:0.1.0-cpu"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def _mirror():
    """The Debian mirror this machine's apt uses (debootstrap fetches the base from it)."""
    for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            words = line.split()
            if line.startswith("URIs:") and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in line:
                return next(w for w in words[1:] if w.startswith("http"))
    return "http://deb.debian.org/debian"


def _podman(env, *args, timeout=600, check=True):
    r = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory):
    apt_ensure(["podman", "buildah", "debootstrap", "runc", "containernetworking-plugins", "fuse-overlayfs"],
               lambda: shutil.which("podman") is not None and shutil.which("debootstrap") is not None)
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root to make the base image (this machine's CI runs as root)")
    # crun fails here (cgroup hybrid mode) and podman's default ulimits exceed the hard limits; file
    # locks, so podman leaves no libpod_lock in /dev/shm
    conf = tmp_path_factory.mktemp("containers") / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
                    '[engine]\nruntime = "runc"\nlock_type = "file"\n')
    return dict(os.environ, CONTAINERS_CONF=str(conf))


@pytest.fixture(scope="module")
def image(podman_env, tmp_path_factory):
    env = podman_env
    if _podman(env, "image", "exists", BASE, check=False).returncode != 0:
        root = tmp_path_factory.mktemp("rootfs")
        r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root), _mirror()],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["podman", "import", "-", BASE], stdin=tar.stdout, env=env, capture_output=True,
                             text=True, timeout=600)
        tar.wait()
        assert imp.returncode == 0, imp.stderr[-3000:]
        shutil.rmtree(root, ignore_errors=True)
    r = subprocess.run([tool("hpccm"), "--recipe", str(REPO / "containers" / "hpccl.py"), "--format", "docker",
                        "--userarg", f"base={BASE}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    dockerfile = tmp_path_factory.mktemp("build") / "Dockerfile.cpu"
    dockerfile.write_text(r.stdout)
    ca = ["-v", f"{HOST_CA}:/ca.crt:ro", "--build-arg", "PIP_CERT=/ca.crt"] if HOST_CA.is_file() else []
    _podman(env, "build", "--network", "host", *ca, "-f", str(dockerfile), "-t", IMAGE, str(REPO), timeout=1200)
    return env


def test_hpccl_info_runs_in_the_image(image):
    r = _podman(image, "run", "--rm", "--network", "host", "--shm-size=1g", IMAGE)  # CMD is hpccl-info
    assert "HPCCL_TIMEOUT" in r.stdout and "topology:" in r.stdout, r.stdout[-2000:]
    assert "hot path" in r.stdout and "not built" not in r.stdout.split("hot path")[1][:80], r.stdout[-2000:]


def test_perf_sweep_with_check_in_the_image(image):
    r = _podman(image, "run", "--rm", "--network", "host", "--shm-size=1g", IMAGE,
                "mpiexec", "-n", "2", "hpccl-perf", "all", "-b", "8", "-e", "4M", "-f", "4", "--check", timeout=600)
    out = r.stdout
    assert "# Out of bounds values : 0 OK" in out, out[-3000:]
    rows = [ln for ln in out.splitlines() if ln.strip() and ln.lstrip()[0].isdigit()]
    assert len(rows) >= 8 * 10, out[-3000:]  # 8 collectives x 8 B .. 4 MiB
    assert all(ln.split()[8] == "0" for ln in rows), [ln for ln in rows if ln.split()[8] != "0"]


def test_nothing_left_in_dev_shm(image):
    _podman(image, "run", "--rm", IMAGE, "true")
    assert not [p for p in Path("/dev/shm").glob("libpod*")], list(Path("/dev/shm").iterdir())


def test_image_is_lean(image):
    r = _podman(image, "run", "--rm", IMAGE, "sh", "-c",
                "command -v gcc cc || echo no-compiler; ls /root/.cache/pip 2>/dev/null || echo no-pip-cache")
    assert "no-compiler" in r.stdout and "no-pip-cache" in r.stdout, r.stdout
    size = int(_podman(image, "image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip())
    base = int(_podman(image, "image", "inspect", BASE, "--format", "{{.Size}}").stdout.strip())
    print(f"\nimage {IMAGE}: {size / 1e6:.0f} MB ({base / 1e6:.0f} MB of it the debootstrap base)")
    assert size < 600e6, size
