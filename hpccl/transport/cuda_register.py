"""Registered GPU buffers (comm.register / comm.deregister): a user's CUDA buffer mapped into every peer
of the node once, so the zero-copy kernels read peers' user memory directly instead of staging through
hpccl's buffers.

Registration is collective and ordered: the k-th register() on every rank makes registration k, each
rank's allocation is exported with a CUDA IPC handle, and every peer opens it (once per allocation,
reference counted). A call uses registration k at offset o on every rank or on none: each zero-copy
kernel compares a descriptor of (k, o) with its peers' before it reads anything. hpccl keeps a reference
to each registered buffer (so it cannot be collected while peers may read it) and checks, at every call,
that the allocation is still the one registered (a freed and re-allocated range has a new buffer id)."""
from __future__ import annotations

import zlib
from typing import Any, Dict, List, Optional, Tuple

from .. import log
from ..errors import HpcclInvalidArgument, HpcclInvalidUsage, HpcclSystemError

IPC_LAZY_PEER = 1  # cudaIpcMemLazyEnablePeerAccess


class Registration:
    """Registration ``rid`` on this rank: this rank's byte range and every rank's range start mapped here."""

    __slots__ = ("rid", "ptr", "nbytes", "buffer_id", "peers", "obj", "opened")

    def __init__(self, rid: int, ptr: int, nbytes: int, buffer_id: int, peers: List[int], obj: Any,
                 opened: List[tuple]) -> None:
        self.rid, self.ptr, self.nbytes, self.buffer_id = rid, ptr, nbytes, buffer_id
        self.peers, self.obj, self.opened = peers, obj, opened

    def holds(self, ptr: int, nbytes: int) -> bool:
        return self.ptr <= ptr and ptr + nbytes <= self.ptr + self.nbytes


class Registry:
    """This rank's registrations, and the peers' allocations it opened for them."""

    def __init__(self, boot: Any, rank: int, size: int, device: int, driver: Any) -> None:
        self.boot, self.rank, self.size, self.device, self.driver = boot, rank, size, device, driver
        self.regs: List[Registration] = []
        self._next = 0
        self._open: Dict[tuple, List[int]] = {}  # (peer, its base, its buffer id) -> [mapped base, refs]

    def __bool__(self) -> bool:
        return bool(self.regs)

    # ----- register / deregister (collective) ------------------------------------------------------------
    def _describe(self, ptr: int, nbytes: int) -> dict:
        """What peers need to map this rank's range, or the reason it cannot be registered."""
        for r in self.regs:
            if ptr < r.ptr + r.nbytes and r.ptr < ptr + nbytes:
                return {"err": f"overlaps registration #{r.rid} ({r.nbytes} B at {r.ptr:#x}); it is already "
                               "registered (deregister it first)", "usage": True}
        try:
            base, size, bid = self.driver.allocation(ptr)
        except HpcclSystemError as exc:
            return {"err": str(exc)}
        import cupy
        try:
            with cupy.cuda.Device(self.device):
                handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError
            return {"err": f"its allocation cannot be exported through CUDA IPC ({exc}); memory from "
                           "cudaMallocAsync pools, cuMemCreate or torch's expandable segments is not supported"}
        return {"handle": handle, "base": base, "bid": bid, "ptr": ptr, "nbytes": nbytes}

    def register(self, ptr: int, nbytes: int, obj: Any, name: str) -> Registration:
        """Register [ptr, ptr + nbytes) of obj on every rank together; all-or-nothing: a rank whose buffer
        cannot be registered makes every rank raise, naming it, and nothing stays registered."""
        import cupy
        with cupy.cuda.Device(self.device):
            mine = self._describe(ptr, nbytes)
        infos = self.boot.allgather(mine, "register")
        self._raise_if_bad(infos, name, "register")
        peers: List[int] = []
        opened: List[tuple] = []
        err = ""
        rt = cupy.cuda.runtime
        with cupy.cuda.Device(self.device):
            for p, info in enumerate(infos):
                if p == self.rank:
                    peers.append(ptr)
                    continue
                key = (p, info["base"], info["bid"])
                ent = self._open.get(key)
                if ent is None and not err:
                    try:
                        ent = self._open[key] = [rt.ipcOpenMemHandle(info["handle"], IPC_LAZY_PEER), 0]
                    except Exception as exc:  # noqa: BLE001
                        err = f"cudaIpcOpenMemHandle of rank {p}'s buffer failed: {exc}"
                if ent is None:
                    peers.append(0)
                    continue
                ent[1] += 1
                opened.append(key)
                peers.append(ent[0] + info["ptr"] - info["base"])
        oks = self.boot.allgather(err, "register")
        if any(oks):
            self._release(opened)
            bad = [p for p, e in enumerate(oks) if e]
            raise HpcclSystemError(f"register: mapping the buffers failed on rank(s) {bad}: "
                                   f"{next(e for e in oks if e)}; nothing was registered")
        reg = Registration(self._next, ptr, nbytes, mine["bid"], peers, obj, opened)
        self._next += 1
        self.regs.append(reg)
        log.info("INIT", "registered #%d: %d B at %#x, mapped into %d peers", reg.rid, nbytes, ptr, len(opened))
        return reg

    def deregister(self, ptr: int, nbytes: int, name: str) -> None:
        """Drop the registration made for exactly this buffer on every rank together, after every rank's
        GPU work is done (a peer's kernel may still read this rank's memory until then)."""
        reg = next((r for r in self.regs if r.ptr == ptr and r.nbytes == nbytes), None)
        mine = {} if reg is not None else {"err": "is not a registered buffer (deregister takes the buffer "
                                                  "that was passed to register)", "usage": True}
        import cupy
        with cupy.cuda.Device(self.device):
            cupy.cuda.runtime.deviceSynchronize()
        infos = self.boot.allgather(mine, "deregister")
        self._raise_if_bad(infos, name, "deregister")
        self.regs.remove(reg)
        self._release(reg.opened)

    def _raise_if_bad(self, infos: List[dict], name: str, what: str) -> None:
        bad = [p for p, i in enumerate(infos) if "err" in i]
        if not bad:
            return
        mine = infos[self.rank]
        if "err" in mine:
            if mine.get("usage"):
                raise HpcclInvalidUsage(f"{what}: {name} {mine['err']}")
            raise HpcclInvalidArgument(name, mine["err"])
        raise HpcclInvalidUsage(f"{what}: rank(s) {bad} passed a buffer that cannot be {what}ed "
                                f"({infos[bad[0]]['err']}); nothing changed on any rank")

    def _release(self, keys: List[tuple]) -> None:
        import cupy
        with cupy.cuda.Device(self.device):
            for key in keys:
                ent = self._open.get(key)
                if ent is None:
                    continue
                ent[1] -= 1
                if ent[1] <= 0:
                    del self._open[key]
                    try:
                        cupy.cuda.runtime.ipcCloseMemHandle(ent[0])
                    except Exception:  # noqa: BLE001
                        pass

    # ----- lookups at call time ----------------------------------------------------------------------------
    def find(self, ptr: int, nbytes: int, name: str) -> Optional[Tuple[Registration, int]]:
        """(registration, offset) holding [ptr, ptr + nbytes), checked to be the allocation registered;
        None when no registration holds it."""
        for reg in self.regs:
            if reg.holds(ptr, nbytes):
                try:
                    bid = self.driver.allocation(ptr)[2]
                except HpcclSystemError:
                    bid = None
                if bid != reg.buffer_id:
                    raise HpcclInvalidUsage(f"{name}: the memory of registration #{reg.rid} was freed after "
                                            "comm.register (deregister a buffer before freeing it)")
                return reg, ptr - reg.ptr
        return None

    @staticmethod
    def descriptor(call: str, *parts: Tuple[Registration, int]) -> int:
        """A 32-bit digest of the call (collective, root, bytes) and its (registration id, offset) pairs,
        never 0: equal on every rank for a symmetric call."""
        text = ",".join([call] + [f"{r.rid}:{o}" for r, o in parts]).encode()
        return (zlib.crc32(text) & 0xFFFFFFFF) or 1

    def close(self) -> None:
        for reg in self.regs:
            self._release(reg.opened)
        self.regs = []
