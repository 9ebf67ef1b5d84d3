"""GPU peer memory for the CUDA path: every rank's staging buffer and flag area, mapped into every
other rank's process.

Two ways to build the mapping, chosen collectively at set-up:
  * 'ipc'  - each rank cudaMallocs its area and exchanges a CUDA IPC handle through the bootstrap; peers
             open it (cudaIpcMemLazyEnablePeerAccess). Works between GPUs with P2P access (NVLink, PCIe)
             and between processes sharing one GPU (more ranks than GPUs).
  * 'host' - without P2P between some pair of GPUs: one POSIX shared-memory segment holds every rank's
             area in pinned, device-mapped host memory (cudaHostRegister), so the same kernels run with
             slots and flags in host memory (PCIe both ways; slower, but correct).
HPCCL_CUDA_TRANSPORT forces one ('ipc' raises if P2P is missing)."""
from __future__ import annotations

import ctypes
import mmap
import os
import secrets
from collections import Counter
from typing import Any, List, Optional

from .. import log
from ..errors import HpcclEnvironmentError, HpcclSystemError, HpcclUnsupported
from ..kernels import FLAG_WORDS, MAX_BLOCKS, Driver
from ..memory.cuda import DeviceAlloc

IPC_LAZY_PEER = 1          # cudaIpcMemLazyEnablePeerAccess
HOST_REGISTER_FLAGS = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped


def _round(x: int, to: int) -> int:
    return (x + to - 1) // to * to


class Layout:
    """Byte layout of one rank's area: [collective slots | p2p slots | flags]."""

    def __init__(self, buffer_bytes: int, nranks: int) -> None:
        self.nranks = nranks
        coll = max(buffer_bytes * 3 // 4, 2 * nranks * MAX_BLOCKS * 4096)
        self.slot = max(4096, (coll // (2 * nranks * MAX_BLOCKS)) // 256 * 256)
        self.coll_bytes = self.slot * 2 * nranks * MAX_BLOCKS
        p2p = max(buffer_bytes // 4, nranks * MAX_BLOCKS * 2 * 4096)
        self.p2p_slot = max(4096, (p2p // (nranks * MAX_BLOCKS * 2)) // 256 * 256)
        self.p2p_off = self.coll_bytes
        self.p2p_bytes = self.p2p_slot * nranks * MAX_BLOCKS * 2
        self.flags_off = _round(self.p2p_off + self.p2p_bytes, 4096)
        self.total = _round(self.flags_off + FLAG_WORDS * 4, 1 << 21)


class PeerMemory:
    """Mapped areas of all ranks: ``stage[r]`` and ``flags[r]`` are device pointers valid in this process."""

    def __init__(self, boot: Any, rank: int, size: int, device: int, buffer_bytes: int, force: str) -> None:
        import cupy
        rt = cupy.cuda.runtime
        self.rank, self.size, self.device = rank, size, device
        self.layout = lay = Layout(buffer_bytes, size)
        self._own: Optional[DeviceAlloc] = None
        self._opened: List[int] = []
        self._host: Optional[dict] = None
        dev = cupy.cuda.Device(device)
        info = {"dev": device, "pci": dev.pci_bus_id, "pid": os.getpid(),
                "sms": int(dev.attributes["MultiProcessorCount"])}
        peers = boot.allgather(info)
        per_gpu = Counter(p["pci"] for p in peers)
        #: most ranks of this communicator on one GPU, and the fewest multiprocessors of their GPUs: every
        #: rank gets the same numbers, from which each launch is sized (CudaComm.block_cap)
        self.share = max(per_gpu.values())
        self.sms = min(p["sms"] for p in peers)
        p2p_ok = self._p2p_possible(peers, rt)
        all_ok = all(boot.allgather(p2p_ok))
        if force == "ipc" and not all_ok:
            raise HpcclEnvironmentError("HPCCL_CUDA_TRANSPORT=ipc but GPU peer access (P2P) is missing "
                                        "between some GPUs of this communicator; unset it to go through "
                                        "pinned host memory")
        self.mode = "ipc" if (all_ok and force != "host") else "host"
        if self.mode == "ipc":
            self._setup_ipc(boot, rt)
        else:
            self._setup_host(boot, rt)
        log.info("TRANSPORT", "CUDA peer memory over %s: %d B per rank (slot %d B, p2p slot %d B)",
                 self.mode, lay.total, lay.slot, lay.p2p_slot)

    def _p2p_possible(self, peers: List[dict], rt: Any) -> bool:
        ndev = rt.getDeviceCount()
        bus = {}
        import cupy
        for d in range(ndev):
            bus[cupy.cuda.Device(d).pci_bus_id] = d
        for r, p in enumerate(peers):
            if r == self.rank or p["pci"] == peers[self.rank]["pci"]:
                continue
            d = bus.get(p["pci"])
            if d is None or not rt.deviceCanAccessPeer(self.device, d):
                return False
        return True

    def _setup_ipc(self, boot: Any, rt: Any) -> None:
        lay = self.layout
        own = DeviceAlloc(lay.total, self.device)
        self._own = own
        import cupy
        with cupy.cuda.Device(self.device):
            rt.memset(own.ptr + lay.flags_off, 0, FLAG_WORDS * 4)
            rt.deviceSynchronize()
            handle = rt.ipcGetMemHandle(own.ptr)
        handles = boot.allgather(bytes(handle))
        bases = []
        with cupy.cuda.Device(self.device):
            for r, h in enumerate(handles):
                if r == self.rank:
                    bases.append(own.ptr)
                    continue
                try:
                    ptr = rt.ipcOpenMemHandle(h, IPC_LAZY_PEER)
                except Exception as exc:  # noqa: BLE001
                    raise HpcclSystemError(f"cudaIpcOpenMemHandle of rank {r}'s buffer failed: {exc}") from None
                self._opened.append(ptr)
                bases.append(ptr)
        self.stage = bases
        self.flags = [b + lay.flags_off for b in bases]
        boot.barrier()

    def _setup_host(self, boot: Any, rt: Any) -> None:
        lay = self.layout
        tag = boot.bcast(secrets.token_hex(6) if self.rank == 0 else None)
        path = f"/dev/shm/hpccl-cuda-{os.getuid()}-{tag}"
        total = lay.total * self.size
        if self.rank == 0:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
            os.ftruncate(fd, total)
        boot.barrier()
        if self.rank != 0:
            fd = os.open(path, os.O_RDWR)
        mm = mmap.mmap(fd, total)
        os.close(fd)
        boot.barrier()
        if self.rank == 0:
            os.unlink(path)  # every rank has it mapped; nothing stays in /dev/shm
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        import cupy
        with cupy.cuda.Device(self.device):
            try:
                rt.hostRegister(addr, total, HOST_REGISTER_FLAGS)
            except Exception as exc:  # noqa: BLE001
                raise HpcclUnsupported(f"GPUs lack peer access and pinning {total} B of shared host memory "
                                       f"failed ({exc}); raise the memlock limit or use fewer ranks") from None
            dbase = Driver.get().host_device_pointer(addr)
        self._host = {"mm": mm, "addr": addr}
        self.stage = [dbase + r * lay.total for r in range(self.size)]
        self.flags = [s + lay.flags_off for s in self.stage]
        boot.barrier()

    def close(self) -> None:
        import cupy
        rt = cupy.cuda.runtime
        with cupy.cuda.Device(self.device):
            for p in self._opened:
                try:
                    rt.ipcCloseMemHandle(p)
                except Exception:  # noqa: BLE001
                    pass
            self._opened = []
            if self._own is not None:
                self._own.free()
                self._own = None
            if self._host is not None:
                try:
                    rt.hostUnregister(self._host["addr"])
                except Exception:  # noqa: BLE001
                    pass
                self._host = None  # the mmap closes when collected (exported pointers may linger)
