"""Single-copy reads from another local process's memory (Linux cross-memory attach, process_vm_readv).

The kernel copies straight from the peer's user buffer into ours: one copy where shared memory needs two
(into the segment, out of it). Needs the same user and ptrace permission; checked at set-up."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

import numpy as np

from ..errors import HpcclSystemError


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                   ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv = _load()
_PIECE = 4 << 20  # the kernel copies large reads best in pieces of a few MiB


def available() -> bool:
    return _readv is not None


def read(pid: int, remote_addr: int, dst: np.ndarray) -> None:
    """Copy dst.nbytes bytes from address remote_addr of process pid into the contiguous array dst."""
    if _readv is None:  # pragma: no cover - guarded by the set-up check
        raise HpcclSystemError("process_vm_readv is not available")
    total = dst.nbytes
    base = dst.ctypes.data
    done = 0
    local, remote = _Iovec(), _Iovec()
    while done < total:
        n = min(_PIECE, total - done)
        local.base, local.len = base + done, n
        remote.base, remote.len = remote_addr + done, n
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise HpcclSystemError(f"process_vm_readv from pid {pid} failed: {os.strerror(err)}")
        done += got


def probe(pid: int, remote_addr: int, expect: int) -> Optional[str]:
    """None if an 8-byte read of a peer's value works and matches; else why not."""
    buf = np.zeros(1, dtype=np.int64)
    try:
        read(pid, remote_addr, buf)
    except HpcclSystemError as exc:
        return str(exc)
    return None if int(buf[0]) == expect else "read back a different value"
