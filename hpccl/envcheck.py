"""Checks of the process environment (shared memory, memlock, GPU peer access) that say what to fix.

Pure functions: nothing here reads HPCCL_* variables (the caller passes values from hpccl.config) and
cupy is imported only inside the GPU check, never at module import.
"""
from __future__ import annotations

import os
import resource
from typing import List, Optional

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


def check_environment(shm_bytes_needed: int, local_size: int, use_gpu: bool = False, *,
                      use_ucx: bool = False, memlock_bytes_needed: int = DEFAULT_MEMLOCK_NEEDED,
                      shm_path: str = SHM_PATH, cupy_module: Optional[object] = None) -> List[str]:
    """Human messages, one per problem, each saying exactly what to fix; empty when all is well.

    ``shm_bytes_needed`` is the shared memory one rank maps; ``local_size`` ranks share the node.
    memlock is checked when ``use_gpu`` or ``use_ucx``; GPU peer access only when ``use_gpu`` and cupy
    imports and sees a device.
    """
    msgs = check_shm(shm_bytes_needed, local_size, shm_path)
    if use_gpu or use_ucx:
        msgs += check_memlock(memlock_bytes_needed)
    if use_gpu:
        msgs += check_gpu_peer_access(local_size, cupy_module)
    return msgs


def require_environment(*args, **kwargs) -> None:
    """Like check_environment, but raise HpcclEnvironmentError listing every problem found."""
    msgs = check_environment(*args, **kwargs)
    if msgs:
        raise HpcclEnvironmentError("the environment cannot run hpccl as configured:\n  - " +
                                    "\n  - ".join(msgs) + "\n(set HPCCL_CHECK_ENV=0 to skip these checks)")
