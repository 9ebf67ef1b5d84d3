"""Host buffers every rank of the node maps (Communicator.alloc_host), hpccl's ncclMemAlloc plus registration.

A buffer of the user's own heap can only be reached from another process by process_vm_readv/writev, which
costs more per byte than a memcpy. A buffer from alloc_host is a
shared segment that each local peer maps once, at allocation: the compiled hot path's direct calls then
copy into and out of it, and reduce straight from it, with plain loads and stores (_hotcore.c, Hot.map()).
Segments are named files in /dev/shm only until every local rank has opened them."""
from __future__ import annotations

import mmap
import os
import secrets
from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np

from ..errors import HpcclInvalidArgument, HpcclSystemError
from ..transport.shm import _live_paths, _Segment


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
    _live_paths.discard(path)


def _shape(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    try:
        dims = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise HpcclInvalidArgument("shape", f"must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise HpcclInvalidArgument("shape", f"has a negative dimension: {dims}")
    return dims


def _failed(nbytes: int, why: Dict[int, str]) -> HpcclSystemError:
    return HpcclSystemError(f"alloc_host of {nbytes} bytes failed on rank(s) {sorted(why)}: {next(iter(why.values()))}")


class HostArena:
    """One communicator's alloc_host segments: its own (the arrays handed out) and the mappings of its local
    peers' (held by the hot path, which owns those mappings and unmaps them)."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self._mine: Dict[int, _Segment] = {}  # start address -> its segment

    def _hot(self) -> Any:
        """The node's compiled hot path if it can map segments (one node, single-copy agreed), else None."""
        hot = self._comm._hot
        return hot if hot is not None and hasattr(hot, "map") else None

    def alloc(self, shape: Union[int, Sequence[int]], dtype: Any) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` in a fresh segment that every local peer maps."""
        dims = _shape(shape)
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise HpcclInvalidArgument("dtype", f"is not a numpy dtype: {dtype!r}") from None
        if dt.hasobject:
            raise HpcclInvalidArgument("dtype", f"{dt} holds Python objects, which cannot be shared")
        comm, rank = self._comm, self._comm.rank
        nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
        size = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
        path = f"/dev/shm/hpccl-{os.getuid()}-h{secrets.token_hex(6)}-{rank}"
        try:
            seg = _Segment(path, size, create=True)
        except HpcclSystemError as exc:
            seg, why = None, str(exc)
        hot = self._hot()
        local = set(comm.nodes.ranks_on(comm.node))
        peers = comm._boot.allgather((path, seg.u8.ctypes.data, size) if seg is not None else why, "alloc_host")
        failed = {r: p for r, p in enumerate(peers) if isinstance(p, str)}
        if failed:  # every rank learns, and nothing stays mapped or named
            if seg is not None:
                seg.close()
                _unlink(path)
            raise _failed(nbytes, failed)
        addr = peers[rank][1]
        mapped: List[Tuple[int, int]] = []
        why = ""
        try:
            if hot is not None:
                hot.map(rank, addr, size, -1)
                mapped.append((rank, addr))
                for r, (p, a, s) in enumerate(peers):
                    if r != rank and r in local:
                        fd = os.open(p, os.O_RDWR)
                        try:
                            hot.map(r, a, s, fd)
                        finally:
                            os.close(fd)
                        mapped.append((r, a))
        except OSError as exc:
            why = f"cannot map a peer's segment: {exc.strerror or exc}"
        # every local rank has its peers' segments open (or says why not): the names can go
        outcome = comm._boot.allgather(why, "alloc_host")
        for p, _, _ in peers:  # a peer that failed after creating its segment cannot unlink it
            _unlink(p)
        failed = {r: w for r, w in enumerate(outcome) if w}
        if failed:
            for r, a in mapped:
                hot.unmap(r, a)
            seg.close()
            raise _failed(nbytes, failed)
        self._mine[addr] = seg
        return seg.u8[:nbytes].view(dt).reshape(dims)

    def free(self, buf: Any) -> None:
        """Give back ``buf`` (an array alloc_host returned, or a view starting where it starts) on every rank
        together: peers drop their mappings of it. The memory itself goes once no array refers to it."""
        try:
            addr = np.asarray(buf).__array_interface__["data"][0]
        except Exception:  # noqa: BLE001 - anything without an address is not ours
            addr = None
        ok = addr in self._mine
        freed = self._comm._boot.allgather(addr if ok else None, "free_host")
        bad = [r for r, a in enumerate(freed) if a is None]
        if bad:
            raise HpcclInvalidArgument("buf", f"was not allocated by alloc_host on this communicator (ranks {bad})")
        hot = self._hot()
        if hot is not None:
            for r, a in enumerate(freed):
                hot.unmap(r, a)
        self._mine.pop(addr).close()

    def close(self) -> None:
        """At destroy: the hot path, and with it every peer mapping, is gone; the arrays handed out stay."""
        for seg in self._mine.values():
            seg.close()
        self._mine.clear()
