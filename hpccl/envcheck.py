"""Checks of the process environment (shared memory, memlock, GPU peer access, GPU-Direct RDMA between
nodes) that say what to fix.

Pure functions: nothing here reads HPCCL_* variables (the caller passes values from hpccl.config) and
cupy is imported only inside the GPU check, never at module import. The GPU-Direct RDMA check reads only
files under a root directory it is given (``sys_root``), so tests build fake /sys trees.

    python -m hpccl.envcheck --gpu-network      # what one node offers a multi-node GPU job
"""
from __future__ import annotations

import argparse
import glob
import os
import resource
import socket
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import HpcclEnvironmentError

SHM_PATH = "/dev/shm"
DEFAULT_MEMLOCK_NEEDED = 64 << 20


def _fmt(n: int) -> str:
    """Human size: 64 MiB, 1.5 GiB, 512 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def check_shm(shm_bytes_needed: int, local_size: int, path: str = SHM_PATH) -> List[str]:
    """Messages if ``path`` cannot hold ``shm_bytes_needed`` bytes per rank for ``local_size`` ranks."""
    need = max(0, int(shm_bytes_needed)) * max(1, int(local_size))
    if need == 0:
        return []
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return [f"{path} is not usable ({exc.strerror}); hpccl needs a shared-memory filesystem there: "
                f"mount a tmpfs on {path} (in a container: docker run --ipc=host or --shm-size=1g)"]
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    if total < need:
        gib = max(1, -(-need * 5 // 4) >> 30)  # need + 25% headroom, in whole GiB, at least 1
        return [f"{path} is {_fmt(total)} but hpccl needs {_fmt(need)} for {local_size} local rank(s) "
                f"x {_fmt(int(shm_bytes_needed))}: run the container with --shm-size={gib}g or "
                f"--ipc=host (Docker's default is 64 MiB), or lower HPCCL_SHM_SLOT_SIZE/HPCCL_SHM_SLOTS/"
                f"HPCCL_SHM_DIRECT_SIZE"]
    if free < need:
        return [f"{path} has {_fmt(free)} free of {_fmt(total)} but hpccl needs {_fmt(need)}: remove "
                f"leftover segments of dead jobs (ls -la {path}; e.g. rm {path}/hpccl-* as their owner) "
                f"or give the job more shared memory (--shm-size / --ipc=host)"]
    return []


def check_memlock(bytes_needed: int = DEFAULT_MEMLOCK_NEEDED) -> List[str]:
    """Messages if RLIMIT_MEMLOCK (soft) is below ``bytes_needed`` (memory registration for UCX/GPU)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= bytes_needed:
        return []
    if hard == resource.RLIM_INFINITY or hard >= bytes_needed:
        hint = "run 'ulimit -l unlimited' in the shell or job script before launching"
    else:
        hint = (f"the hard limit is {_fmt(hard)} too: set 'memlock unlimited' in "
                f"/etc/security/limits.conf (Slurm: PropagateResourceLimits=ALL, or srun --propagate=MEMLOCK)")
    return [f"locked-memory limit (ulimit -l) is {_fmt(soft)}, below the {_fmt(bytes_needed)} that "
            f"UCX/GPU memory registration needs: {hint}; in a container run with --ulimit memlock=-1"]


def check_gpu_peer_access(local_size: int, cupy_module: Optional[object] = None) -> List[str]:
    """Messages if the GPUs this node's ranks use cannot reach each other (CUDA peer access)."""
    if local_size <= 1:
        return []
    cp = cupy_module
    if cp is None:
        try:
            import cupy as cp  # noqa: F811  (imported only when a GPU check is asked for)
        except Exception:
            return []
    try:
        if not cp.cuda.is_available():
            return []
        rt = cp.cuda.runtime
        ndev = int(rt.getDeviceCount())
    except Exception:
        return []
    if ndev == 1:
        return [f"{local_size} ranks share this node but each sees only 1 GPU: GPU peer (CUDA IPC) "
                f"transfers need every GPU of the node visible to every rank; in Slurm use "
                f"--gpus-per-node=N without --gpus-per-task (or --gpu-bind=none), and do not set a "
                f"per-rank CUDA_VISIBLE_DEVICES; hpccl picks device local_rank itself"]
    used = min(ndev, local_size)
    missing = []
    for i in range(used):
        for j in range(used):
            if i != j:
                try:
                    ok = bool(rt.deviceCanAccessPeer(i, j))
                except Exception:
                    ok = False
                if not ok:
                    missing.append(f"{i}->{j}")
    if not missing:
        return []
    return [f"GPU peer access is not possible between devices {', '.join(missing)} (check "
            f"'nvidia-smi topo -m'; IOMMU/ACS on PCIe, or GPUs in different VMs/containers without "
            f"--ipc=host): hpccl falls back to staging through host memory, which is much slower"]


# --- GPU-Direct RDMA between nodes -------------------------------------------------------------------

#: Where the RDMA devices (InfiniBand HCAs and RoCE NICs) appear, relative to the root.
IB_CLASS = "sys/class/infiniband"
#: Any of these means an NVIDIA peer-memory client is loaded, i.e. the HCA can register GPU memory the
#: classic way. UCX tests the memory_peers file (and, in some versions, the two module folders).
PEERMEM_PATHS = ("sys/module/nvidia_peermem", "sys/module/nv_peer_mem",
                 "sys/kernel/mm/memory_peers/nv_mem/version")
#: GDRCopy's device (the gdrdrv module); UCX's gdr_copy transport needs it.
GDRCOPY_DEV = "dev/gdrdrv"

_NO_RDMA_FALLBACK = ("UCX between nodes will run over TCP (tcp transport) and stage CUDA buffers through "
                     "host memory with cuda_copy, so expect the Ethernet NIC's TCP bandwidth, not RDMA")


def _under(sys_root: str, rel: str) -> str:
    return os.path.join(sys_root, rel)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def rdma_ports(sys_root: str = "/") -> Dict[str, List[Tuple[str, str, str]]]:
    """{device: [(port, state, link_layer), ...]} from ``<sys_root>/sys/class/infiniband``.

    state is the text after "N: " in the port's ``state`` file (ACTIVE, DOWN, INIT...); link_layer is
    InfiniBand or Ethernet (RoCE). Empty when the folder is absent or empty."""
    base = _under(sys_root, IB_CLASS)
    try:
        devs = sorted(os.listdir(base))
    except OSError:
        return {}
    out: Dict[str, List[Tuple[str, str, str]]] = {}
    for dev in devs:
        ports_dir = os.path.join(base, dev, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError:
            ports = []
        rows = []
        for port in ports:
            state = _read(os.path.join(ports_dir, port, "state"))  # e.g. "4: ACTIVE"
            state = state.split(":", 1)[1].strip() if ":" in state else (state or "unknown")
            rows.append((port, state, _read(os.path.join(ports_dir, port, "link_layer")) or "unknown"))
        out[dev] = rows
    return out


def peermem_found(sys_root: str = "/") -> Optional[str]:
    """The first of PEERMEM_PATHS that exists under ``sys_root`` (as '/sys/...'), or None."""
    for rel in PEERMEM_PATHS:
        if os.path.exists(_under(sys_root, rel)):
            return "/" + rel
    return None


def gdrcopy_found(sys_root: str = "/") -> bool:
    """Whether GDRCopy's device ``<sys_root>/dev/gdrdrv`` exists."""
    return os.path.exists(_under(sys_root, GDRCOPY_DEV))


def loaded_ucx_module_dirs(maps_path: str = "/proc/self/maps") -> List[str]:
    """The transport-module folders (``<libdir>/ucx``) of every UCX (libucs.so) mapped in this process.

    Call it after the UCX to inspect is loaded (e.g. ``libucx.load_library()``, what the engine does), and in
    a process that has loaded no other UCX (an MPI library may bring its own)."""
    dirs: List[str] = []
    try:
        with open(maps_path) as f:
            lines = f.readlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(None, 5)  # address perms offset dev inode [path]
        path = fields[5].strip() if len(fields) == 6 else ""
        if os.path.basename(path).startswith("libucs.so"):
            d = os.path.join(os.path.dirname(path), "ucx")
            if d not in dirs:
                dirs.append(d)
    return dirs


def _has_module(dirs: Sequence[str], prefix: str) -> bool:
    return any(glob.glob(os.path.join(d, prefix + ".so*")) for d in dirs)


def _ports_text(ports: Dict[str, List[Tuple[str, str, str]]]) -> str:
    return ", ".join(f"{dev} ({'; '.join(f'port {p} {st} {ll}' for p, st, ll in rows) or 'no ports'})"
                     for dev, rows in ports.items())


def check_gpudirect(sys_root: str = "/", ucx_dirs: Optional[Sequence[str]] = None) -> List[str]:
    """Messages when CUDA buffers cannot go between nodes by GPU-Direct RDMA, empty when they can.

    Each says what was found, what UCX will fall back to, and what to do. Looks at RDMA devices and
    their ports (``sys/class/infiniband``) and the NVIDIA peer-memory module (PEERMEM_PATHS), all under
    ``sys_root``. ``ucx_dirs``: the transport-module folders of the UCX that will carry the traffic
    (see loaded_ucx_module_dirs); when given (non-empty), also checks that UCX has its InfiniBand (libuct_ib) and
    CUDA (libuct_cuda) transports. GDRCopy is optional and not reported here (see describe_gpudirect).
    DMA-BUF registration cannot be seen from files; where UCX uses it, the peer-memory message is moot,
    and the message says so."""
    msgs: List[str] = []
    if ucx_dirs and not _has_module(ucx_dirs, "libuct_cuda"):
        msgs.append(f"the UCX in use ({', '.join(ucx_dirs)}) has no CUDA transports "
                    f"(no libuct_cuda.so): it cannot move CUDA buffers between nodes at all (neither "
                    f"GPU-Direct RDMA nor cuda_copy staging); use a UCX built --with-cuda (the "
                    f"libucx-cu13 wheel's, or a system UCX via RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true)")
    ports = rdma_ports(sys_root)
    ib_path = _under(sys_root, IB_CLASS)
    if not ports:
        msgs.append(f"GPU-Direct RDMA is not available: no InfiniBand/RoCE device on this node ({ib_path} "
                    f"is empty or absent): {_NO_RDMA_FALLBACK}. If the node has an HCA, load its driver "
                    f"(e.g. mlx5_ib); in a container, make sure the runtime passes the host's RDMA devices "
                    f"(/dev/infiniband) in")
        return msgs
    active = [dev for dev, rows in ports.items() if any(st == "ACTIVE" for _, st, _ in rows)]
    if not active:
        msgs.append(f"GPU-Direct RDMA is not available: InfiniBand/RoCE device(s) {_ports_text(ports)} but "
                    f"no port is ACTIVE, and UCX skips inactive ports: {_NO_RDMA_FALLBACK}. Check the link "
                    f"with 'ibstat' or 'ibv_devinfo' (cable, switch port; on InfiniBand a running subnet "
                    f"manager)")
        return msgs
    devs = ", ".join(active)
    if ucx_dirs and not _has_module(ucx_dirs, "libuct_ib"):
        msgs.append(f"the UCX in use ({', '.join(ucx_dirs)}) has no InfiniBand/RoCE "
                    f"transports (no libuct_ib.so), so despite {devs} {_NO_RDMA_FALLBACK}. The libucx-cu13 "
                    f"wheel's UCX is built without verbs: use a system UCX built with verbs and CUDA "
                    f"(export RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true, its lib first on LD_LIBRARY_PATH)")
    if peermem_found(sys_root) is None:
        looked = ", ".join("/" + p for p in PEERMEM_PATHS)
        msgs.append(f"GPU-Direct RDMA is not detected: {devs} active but no NVIDIA peer-memory module "
                    f"is loaded (none of {looked}), so UCX cannot register GPU memory with the HCA and "
                    f"rc/dc move CUDA buffers through host memory (cuda_copy staging: lower bandwidth, "
                    f"higher latency). Fix: 'modprobe nvidia-peermem' (shipped with the NVIDIA driver "
                    f"since R470; it needs the MLNX_OFED/DOCA peer-memory support), or DMA-BUF instead: "
                    f"kernel >= 5.12, NVIDIA open kernel modules and a UCX built with DMA-BUF support "
                    f"(if UCX uses DMA-BUF, ignore this message; UCX_LOG_LEVEL=debug prints what UCX "
                    f"detected on lines mentioning 'GPUDirect RDMA' and 'dmabuf')")
    return msgs


def describe_gpudirect(sys_root: str = "/", ucx_dirs: Optional[Sequence[str]] = None) -> str:
    """One line for a job log: RDMA devices and ports, peer-memory module, GDRCopy, UCX modules."""
    ports = rdma_ports(sys_root)
    active = [dev for dev, rows in ports.items() if any(st == "ACTIVE" for _, st, _ in rows)]
    peer = peermem_found(sys_root)
    ucx_ib = not ucx_dirs or _has_module(ucx_dirs, "libuct_ib")
    ucx_cuda = not ucx_dirs or _has_module(ucx_dirs, "libuct_cuda")
    if active and peer and ucx_ib and ucx_cuda:
        verdict = "yes"
    elif active and ucx_ib and ucx_cuda:
        verdict = "not detected (no peer-memory module; only DMA-BUF could give it)"
    else:
        verdict = "no"
    parts = [f"GPU-Direct RDMA: {verdict}",
             f"RDMA devices: {_ports_text(ports) if ports else 'none'}",
             f"peer memory: {peer or 'none'}",
             "GDRCopy: " + ("/dev/gdrdrv present" if gdrcopy_found(sys_root) else
                            "absent (optional: UCX's gdr_copy lowers small-message latency to/from GPU "
                            "memory; without it cuda_copy does those copies)")]
    if ucx_dirs:
        mods = [name for name, ok in (("ib", _has_module(ucx_dirs, "libuct_ib")),
                                      ("cuda", _has_module(ucx_dirs, "libuct_cuda")),
                                      ("gdrcopy", _has_module(ucx_dirs, "libuct_cuda_gdrcopy"))) if ok]
        parts.append(f"UCX modules in {', '.join(ucx_dirs)}: "
                     f"{', '.join(mods) or 'none of ib, cuda, gdrcopy'}")
    return "; ".join(parts)


def check_environment(shm_bytes_needed: int, local_size: int, use_gpu: bool = False, *,
                      use_ucx: bool = False, gpu_network: bool = False,
                      memlock_bytes_needed: int = DEFAULT_MEMLOCK_NEEDED,
                      shm_path: str = SHM_PATH, cupy_module: Optional[object] = None,
                      sys_root: str = "/", ucx_dirs: Optional[Sequence[str]] = None) -> List[str]:
    """Human messages, one per problem, each saying exactly what to fix; empty when all is well.

    ``shm_bytes_needed`` is the shared memory one rank maps; ``local_size`` ranks share the node.
    memlock is checked when ``use_gpu``, ``use_ucx`` or ``gpu_network``; GPU peer access only when
    ``use_gpu`` and cupy imports and sees a device. ``gpu_network``: the job moves CUDA buffers between
    nodes, so GPU-Direct RDMA is checked (check_gpudirect with ``sys_root`` and ``ucx_dirs``); its
    messages are advice, UCX still works without it (slower).
    """
    msgs = check_shm(shm_bytes_needed, local_size, shm_path)
    if use_gpu or use_ucx or gpu_network:
        msgs += check_memlock(memlock_bytes_needed)
    if use_gpu:
        msgs += check_gpu_peer_access(local_size, cupy_module)
    if gpu_network:
        msgs += check_gpudirect(sys_root, ucx_dirs)
    return msgs


def require_environment(*args, **kwargs) -> None:
    """Like check_environment, but raise HpcclEnvironmentError listing every problem found."""
    msgs = check_environment(*args, **kwargs)
    if msgs:
        raise HpcclEnvironmentError("the environment cannot run hpccl as configured:\n  - " +
                                    "\n  - ".join(msgs) + "\n(set HPCCL_CHECK_ENV=0 to skip these checks)")


def _libucx_module_dirs() -> Optional[List[str]]:
    """Load the UCX that hpccl's network engine would use (libucx.load_library) and return its module folders; None when
    the libucx package is not installed."""
    try:
        import libucx
    except ImportError:
        return None
    try:
        libucx.load_library()
    except OSError:
        return None
    dirs = loaded_ucx_module_dirs()
    extra = os.environ.get("UCX_MODULE_DIR")  # UCX also searches this folder for transport modules
    if dirs and extra and extra not in dirs:
        dirs.append(extra)
    return dirs or None


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m hpccl.envcheck [--gpu-network] [--strict]``: this node's checks, one line each."""
    p = argparse.ArgumentParser(prog="python -m hpccl.envcheck",
                                description="Check this node for hpccl: locked-memory limit (for UCX) "
                                            "and, with --gpu-network, GPU-Direct RDMA between nodes.")
    p.add_argument("--gpu-network", action="store_true",
                   help="the job moves CUDA buffers between nodes: check RDMA devices, the NVIDIA "
                        "peer-memory module, GDRCopy and the UCX that hpccl's engine loads")
    p.add_argument("--sys-root", default="/", help="read /sys and /dev under this folder (tests)")
    p.add_argument("--no-ucx-lib", action="store_true",
                   help="do not load the libucx wheel's UCX to check its transports")
    p.add_argument("--strict", action="store_true", help="exit 1 when any problem is reported")
    a = p.parse_args(argv)
    host = socket.gethostname()
    ucx_dirs = None if (a.no_ucx_lib or not a.gpu_network) else _libucx_module_dirs()
    if a.gpu_network:
        print(f"envcheck {host}: {describe_gpudirect(a.sys_root, ucx_dirs)}", flush=True)
    msgs = check_environment(0, 1, use_ucx=True, gpu_network=a.gpu_network, sys_root=a.sys_root,
                             ucx_dirs=ucx_dirs)
    for msg in msgs:
        print(f"envcheck {host}: WARNING: {msg}", flush=True)
    if not msgs:
        print(f"envcheck {host}: no problems found", flush=True)
    return 1 if (msgs and a.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
