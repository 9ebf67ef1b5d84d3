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


# --- GPU-Direct RDMA (check_gpudirect) on fake /sys trees -------------------------------------------

def make_sys(root, ports=None, peermem=None, gdrcopy=False, empty_class=False):
    """A fake filesystem root: ports = {device: {port: (state, link_layer)}}; peermem = a relative path
    from envcheck.PEERMEM_PATHS to create; gdrcopy creates dev/gdrdrv."""
    ib = root / "sys" / "class" / "infiniband"
    if empty_class:
        ib.mkdir(parents=True)
    for dev, dev_ports in (ports or {}).items():
        for port, (state, link) in dev_ports.items():
            d = ib / dev / "ports" / port
            d.mkdir(parents=True)
            (d / "state").write_text(state + "\n")
            (d / "link_layer").write_text(link + "\n")
    if peermem:
        p = root / peermem
        if p.name == "version":
            p.parent.mkdir(parents=True)
            p.write_text("1.0\n")
        else:
            p.mkdir(parents=True)
            (p / "version").write_text("580.65.06\n")
    if gdrcopy:
        (root / "dev").mkdir()
        (root / "dev" / "gdrdrv").write_text("")
    return str(root)


IB_UP = {"mlx5_0": {"1": ("4: ACTIVE", "InfiniBand")}, "mlx5_1": {"1": ("4: ACTIVE", "InfiniBand")}}


def make_ucx(root, modules):
    d = root / "ucx"
    d.mkdir(parents=True)
    for m in modules:
        (d / m).write_text("")
    return [str(d)]


def test_gpudirect_no_rdma_device_means_tcp_and_cuda_copy(tmp_path):
    for i, kw in enumerate(({}, {"empty_class": True})):
        root = make_sys(tmp_path / str(i), **kw)
        msgs = envcheck.check_gpudirect(root)
        assert len(msgs) == 1, msgs
        m = msgs[0]
        assert "no InfiniBand/RoCE device" in m and "TCP (tcp transport)" in m and "cuda_copy" in m
        assert os.path.join(root, "sys/class/infiniband") in m  # says where it looked
        assert "nvidia-peermem" not in m  # the module is not the problem here


def test_gpudirect_ib_without_peermem_names_the_module(tmp_path):
    root = make_sys(tmp_path, IB_UP)
    msgs = envcheck.check_gpudirect(root)
    assert len(msgs) == 1, msgs
    m = msgs[0]
    assert "mlx5_0, mlx5_1 active" in m
    assert "modprobe nvidia-peermem" in m and "cuda_copy" in m and "rc/dc" in m and "DMA-BUF" in m
    assert "TCP" not in m  # with an active HCA UCX keeps RDMA for the transfer, only staged


@pytest.mark.parametrize("peermem", envcheck.PEERMEM_PATHS)
def test_gpudirect_ib_with_peermem_is_fine(tmp_path, peermem):
    root = make_sys(tmp_path, IB_UP, peermem=peermem)
    assert envcheck.peermem_found(root) == "/" + peermem
    assert envcheck.check_gpudirect(root) == []


def test_gpudirect_roce_with_peermem_is_fine(tmp_path):
    root = make_sys(tmp_path, {"mlx5_2": {"1": ("4: ACTIVE", "Ethernet")}}, peermem="sys/module/nvidia_peermem")
    assert envcheck.rdma_ports(root) == {"mlx5_2": [("1", "ACTIVE", "Ethernet")]}
    assert envcheck.check_gpudirect(root) == []


def test_gpudirect_ports_down_means_tcp(tmp_path):
    root = make_sys(tmp_path, {"mlx5_0": {"1": ("1: DOWN", "InfiniBand"), "2": ("2: INIT", "InfiniBand")}},
                    peermem="sys/module/nvidia_peermem")
    msgs = envcheck.check_gpudirect(root)
    assert len(msgs) == 1, msgs
    assert "no port is ACTIVE" in msgs[0] and "port 1 DOWN" in msgs[0] and "port 2 INIT" in msgs[0]
    assert "TCP" in msgs[0] and "ibstat" in msgs[0]


def test_gpudirect_one_active_device_is_enough(tmp_path):
    root = make_sys(tmp_path, {"mlx5_0": {"1": ("1: DOWN", "InfiniBand")},
                               "mlx5_1": {"1": ("4: ACTIVE", "InfiniBand")}},
                    peermem="sys/module/nv_peer_mem")
    assert envcheck.check_gpudirect(root) == []


def test_gpudirect_ucx_without_verbs_or_cuda(tmp_path):
    root = make_sys(tmp_path / "sys", IB_UP, peermem="sys/module/nvidia_peermem")
    wheel_like = make_ucx(tmp_path / "wheel", ["libuct_cuda.so", "libuct_cuda.so.0", "libuct_cma.so.0"])
    msgs = envcheck.check_gpudirect(root, wheel_like)
    assert len(msgs) == 1 and "no libuct_ib.so" in msgs[0] and "TCP" in msgs[0], msgs
    assert "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true" in msgs[0]
    no_cuda = make_ucx(tmp_path / "nocuda", ["libuct_ib.so.0"])
    msgs = envcheck.check_gpudirect(root, no_cuda)
    assert len(msgs) == 1 and "no libuct_cuda.so" in msgs[0], msgs
    full = make_ucx(tmp_path / "full", ["libuct_ib.so.0", "libuct_cuda.so.0", "libuct_cuda_gdrcopy.so.0"])
    assert envcheck.check_gpudirect(root, full) == []
    assert envcheck.check_gpudirect(root, []) == []  # no UCX found: the library is not judged


def test_describe_gpudirect(tmp_path):
    good = make_sys(tmp_path / "good", IB_UP, peermem="sys/module/nvidia_peermem", gdrcopy=True)
    line = envcheck.describe_gpudirect(good)
    assert line.startswith("GPU-Direct RDMA: yes;") and "mlx5_0 (port 1 ACTIVE InfiniBand)" in line
    assert "peer memory: /sys/module/nvidia_peermem" in line and "GDRCopy: /dev/gdrdrv present" in line
    nopeer = envcheck.describe_gpudirect(make_sys(tmp_path / "nopeer", IB_UP))
    assert nopeer.startswith("GPU-Direct RDMA: not detected") and "GDRCopy: absent (optional" in nopeer
    assert envcheck.describe_gpudirect(make_sys(tmp_path / "none")).startswith(
        "GPU-Direct RDMA: no; RDMA devices: none")


def test_check_environment_gpu_network_flag(monkeypatch, tmp_path):
    monkeypatch.setattr(envcheck.os, "statvfs", fake_statvfs(1 << 30, 1 << 30))
    set_memlock(monkeypatch, resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    root = make_sys(tmp_path)  # no RDMA device at all
    # existing callers (no gpu_network) never look at the RDMA state
    assert envcheck.check_environment(MiB, 2, False, sys_root=root) == []
    assert envcheck.check_environment(MiB, 2, False, use_ucx=True, sys_root=root) == []
    msgs = envcheck.check_environment(MiB, 2, False, gpu_network=True, sys_root=root)
    assert len(msgs) == 1 and "cuda_copy" in msgs[0], msgs
    ok = make_sys(tmp_path / "ok", IB_UP, peermem="sys/module/nvidia_peermem")
    assert envcheck.check_environment(MiB, 2, False, gpu_network=True, sys_root=ok) == []
    set_memlock(monkeypatch, 64 << 10, 64 << 10)  # gpu_network alone also checks memlock
    msgs = envcheck.check_environment(0, 2, gpu_network=True, sys_root=ok)
    assert len(msgs) == 1 and "memlock" in msgs[0], msgs


def test_loaded_ucx_module_dirs(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f10 r--p 00000000 fe:00 11   /opt/ucx/lib/libucs.so.0.0.0\n"
        "7f10-7f20 r-xp 00010000 fe:00 11   /opt/ucx/lib/libucs.so.0.0.0\n"
        "7f20-7f30 rw-p 00000000 00:00 0 \n"
        "7f30-7f40 r--p 00000000 fe:00 12   /opt/ucx/lib/libucp.so.0\n"
        "7f40-7f50 r--p 00000000 fe:00 13   /venv/libucx/lib/libucs.so\n")
    assert envcheck.loaded_ucx_module_dirs(str(maps)) == ["/opt/ucx/lib/ucx", "/venv/libucx/lib/ucx"]
    assert envcheck.loaded_ucx_module_dirs(str(tmp_path / "absent")) == []


def test_cli_gpu_network(monkeypatch, tmp_path, capsys):
    set_memlock(monkeypatch, resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    bare = make_sys(tmp_path / "bare")
    args = ["--gpu-network", "--no-ucx-lib", "--sys-root"]
    assert envcheck.main(args + [bare]) == 0  # advice only: the job goes on
    out = capsys.readouterr().out
    assert "GPU-Direct RDMA: no;" in out and "WARNING: GPU-Direct RDMA is not available" in out
    assert envcheck.main(args + [bare, "--strict"]) == 1
    capsys.readouterr()
    good = make_sys(tmp_path / "good", IB_UP, peermem="sys/module/nvidia_peermem")
    assert envcheck.main(args + [good, "--strict"]) == 0
    out = capsys.readouterr().out
    assert "GPU-Direct RDMA: yes;" in out and "no problems found" in out and "WARNING" not in out
    assert envcheck.main(["--sys-root", bare]) == 0  # without --gpu-network: no RDMA check
    assert "GPU-Direct" not in capsys.readouterr().out


def test_module_entry_point_and_wheel_ucx(tmp_path):
    """python -m hpccl.envcheck runs; where the libucx wheel's UCX is installed, it is read for real."""
    import subprocess
    import sys
    root = make_sys(tmp_path, IB_UP, peermem="sys/module/nvidia_peermem")
    out = subprocess.run([sys.executable, "-m", "hpccl.envcheck", "--gpu-network", "--sys-root", root],
                         capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    if out.returncode != 0 and "No module named" in out.stderr:
        pytest.skip(f"hpccl does not import: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr
    assert "RuntimeWarning" not in out.stderr, out.stderr
    assert "GPU-Direct RDMA:" in out.stdout
    try:
        import libucx  # noqa: F401
    except ImportError:
        return
    # the libucx-cu13 wheel's UCX has CUDA transports but no verbs: say so despite the HCAs
    if "libucx/lib/ucx" in out.stdout and "RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY" not in os.environ:
        assert "UCX modules in" in out.stdout and ": cuda" in out.stdout, out.stdout
        assert "no libuct_ib.so" in out.stdout, out.stdout
