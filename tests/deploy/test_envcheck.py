"""Unit tests of hpccl.envcheck with faked statvfs, rlimit and cupy."""
import os
import resource
import types

import pytest

envcheck = pytest.importorskip("hpccl.envcheck")
from hpccl.errors import HpcclEnvironmentError  # noqa: E402

MiB = 1 << 20


def fake_statvfs(total, free, frsize=4096):
    def statvfs(path):
        return os.statvfs_result((frsize, frsize, total // frsize, free // frsize, free // frsize,
                                  0, 0, 0, 0, 255))
    return statvfs


def set_memlock(monkeypatch, soft, hard):
    real = resource.getrlimit

    def getrlimit(which):
        return (soft, hard) if which == resource.RLIMIT_MEMLOCK else real(which)
    monkeypatch.setattr(envcheck.resource, "getrlimit", getrlimit)


def fake_cupy(ndev, peer=lambda i, j: 1, available=True):
    rt = types.SimpleNamespace(getDeviceCount=lambda: ndev, deviceCanAccessPeer=peer)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: available, runtime=rt))


def test_all_good(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(8 << 30, 8 << 30))
    set_memlock(monkeypatch, resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert envcheck.check_environment(64 * MiB, 8, use_gpu=True, cupy_module=fake_cupy(8)) == []


def test_docker_default_shm(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(64 * MiB, 64 * MiB))
    msgs = envcheck.check_environment(16 * MiB, 8)
    assert len(msgs) == 1
    assert "64 MiB" in msgs[0] and "128 MiB" in msgs[0]
    assert "--shm-size=1g" in msgs[0] and "--ipc=host" in msgs[0]


def test_shm_full_of_leftovers(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(1 << 30, 10 * MiB))
    msgs = envcheck.check_environment(16 * MiB, 2)
    assert len(msgs) == 1 and "free" in msgs[0] and "leftover" in msgs[0]


def test_shm_missing(monkeypatch):
    def boom(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    monkeypatch.setattr(envcheck.os, "statvfs", boom)
    msgs = envcheck.check_environment(MiB, 2)
    assert len(msgs) == 1 and "/dev/shm" in msgs[0] and "tmpfs" in msgs[0]


def test_no_shm_needed_no_statvfs(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", lambda p: pytest.fail("statvfs called"))
    assert envcheck.check_environment(0, 4) == []


def test_memlock_only_checked_for_gpu_or_ucx(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(1 << 30, 1 << 30))
    set_memlock(monkeypatch, 64 << 10, 64 << 10)
    assert envcheck.check_environment(MiB, 2) == []
    for kw in ({"use_ucx": True}, {"use_gpu": True, "cupy_module": fake_cupy(2)}):
        msgs = envcheck.check_environment(MiB, 2, **kw)
        assert len(msgs) == 1, msgs
        assert "64 KiB" in msgs[0] and "--ulimit memlock=-1" in msgs[0] and "limits.conf" in msgs[0]


def test_memlock_soft_only(monkeypatch):
    set_memlock(monkeypatch, 8 * MiB, resource.RLIM_INFINITY)
    msgs = envcheck.check_memlock()
    assert len(msgs) == 1 and "ulimit -l unlimited" in msgs[0]
    set_memlock(monkeypatch, 128 * MiB, resource.RLIM_INFINITY)
    assert envcheck.check_memlock() == []


def test_gpu_no_peer_access(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(1 << 30, 1 << 30))
    set_memlock(monkeypatch, resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    cp = fake_cupy(4, peer=lambda i, j: 0 if {i, j} == {0, 3} else 1)
    msgs = envcheck.check_environment(MiB, 4, use_gpu=True, cupy_module=cp)
    assert len(msgs) == 1 and "0->3" in msgs[0] and "3->0" in msgs[0] and "1->2" not in msgs[0]


def test_gpu_one_visible_per_rank():
    msgs = envcheck.check_gpu_peer_access(8, fake_cupy(1))
    assert len(msgs) == 1 and "--gpus-per-task" in msgs[0]


def test_gpu_skipped_without_device_or_single_rank():
    assert envcheck.check_gpu_peer_access(4, fake_cupy(0, available=False)) == []
    assert envcheck.check_gpu_peer_access(1, fake_cupy(1)) == []


def test_no_cupy_import_at_module_import():
    import subprocess
    import sys
    code = "import sys, hpccl.envcheck; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    if out.returncode != 0:
        pytest.skip(f"hpccl package does not import yet: {out.stderr.strip()[-200:]}")
    assert out.stdout.strip() == "False"


def test_require_environment_raises(monkeypatch):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(64 * MiB, 64 * MiB))
    with pytest.raises(HpcclEnvironmentError) as ei:
        envcheck.require_environment(64 * MiB, 4)
    assert "--shm-size" in str(ei.value) and "HPCCL_CHECK_ENV=0" in str(ei.value)
    assert ei.value.code == 6
