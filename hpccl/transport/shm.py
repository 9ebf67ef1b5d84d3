"""Host shared memory within a node: per-pair slot rings for messages, a mapped window for direct algorithms.

Each rank owns one POSIX shared-memory segment (mode 0600, named per job and communicator) holding the
inbound channels from every local peer and its window. Peers map it; once all have, the name is unlinked,
so nothing is left in /dev/shm even if a process is killed. Senders copy into the receiver's slots; the
receiver copies or reduces straight out of them with numpy ufuncs (one copy per hop, no pickling).
Counters are int64 stores: on x86-64 (TSO) a store of the counter after the data publishes the data.
"""
from __future__ import annotations

import atexit
import mmap
import os
import platform
import secrets
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

import numpy as np

from .. import config, log
from ..errors import HpcclInvalidArgument, HpcclSystemError
from ..ops import UFUNC, ReduceOp
from . import cma
from .base import Request, Transport, Window

_LINE = 64
_HDR = 4096
_MAGIC = 0x6870_6363_6C00_0001
# int64 indexes in the header (one cache line apart)
_I_MAGIC, _I_ARRIVED, _I_ABORT, _I_BARRIER = 0, 8, 16, 24
# cross-memory attach: pid, where this header sits in its owner's address space, a probe value, and the
# table of exposed buffers (address, bytes) x 4
_I_PID, _I_HDRADDR, _I_PROBE, _I_EXPOSE, _EXPOSE_MAX = 32, 33, 34, 40, 4
_I_DEVSEQ = 36  # GPU kernels this rank has launched on the communicator (names who never launched one)
# the error word this rank's GPU kernels poll (its low 32 bits; the page is registered with CUDA by the GPU
# engine): a kernel's own timeout sets it, and any local rank's abort sets every rank's, so kernels spinning
# on a peer that failed exit within microseconds instead of at HPCCL_TIMEOUT
_I_GPUERR = 48
_I_HOT = 56  # calls this rank made on the compiled hot path (hpccl/csrc/_hotcore.c)
# the hot path's direct calls: this rank's input address for the call (the next word: a direct all_reduce's
# output), and its "done" word (8 words on: a direct all_reduce's second done word)
_I_HOTADDR, _I_HOTDONE = 64, 72
GPU_ERR_ABORT = 2  # cuda/hpccl_device.cuh HPCCL_ERR_ABORT
# the GPU engine's stream-synchronised protocol (hpccl/gpu/gpu_sync.py): its u32 words, in the registered header page
_B_GPUSYNC = 2048

_live_paths: Set[str] = set()


def _cleanup_paths() -> None:
    for p in list(_live_paths):
        try:
            os.unlink(p)
        except OSError:
            pass
        _live_paths.discard(p)


atexit.register(_cleanup_paths)


def _round(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _Layout:
    """Byte offsets inside one rank's segment, the same for every rank of a communicator."""

    def __init__(self, nlocal: int, slots: int, slot_size: int, window: int, hot: int = 0) -> None:
        self.slots, self.slot_size, self.window, self.hot = slots, slot_size, window, hot
        self.ctrl_stride = _round(2 * _LINE + 16 * slots, _LINE)
        self.ctrl_off = _HDR
        self.data_off = _round(self.ctrl_off + nlocal * self.ctrl_stride, 4096)
        self.win_off = _round(self.data_off + nlocal * slots * slot_size, 4096)
        self.hot_off = _round(self.win_off + window, 4096)  # the hot path's two slots of ``hot`` bytes
        self.total = _round(self.hot_off + 2 * hot, 4096)

    @classmethod
    def configured(cls, nlocal: int) -> "_Layout":
        """The layout the HPCCL_SHM_* and HPCCL_HOT_SIZE settings give for ``nlocal`` ranks on the node."""
        window = _round(max(config.get("HPCCL_SHM_DIRECT_SIZE"), 4096), 4096)
        hot = _round(max(config.get("HPCCL_HOT_SIZE"), 0), 64)
        return cls(nlocal, config.get("HPCCL_SHM_SLOTS"), config.get("HPCCL_SHM_SLOT_SIZE"), window, hot)

    def head(self, src: int) -> int:   # int64 index of the channel src -> owner: chunks posted
        return (self.ctrl_off + src * self.ctrl_stride) // 8

    def tail(self, src: int) -> int:   # chunks consumed
        return (self.ctrl_off + src * self.ctrl_stride + _LINE) // 8

    def lens(self, src: int) -> int:   # K lengths, then K last-chunk marks
        return (self.ctrl_off + src * self.ctrl_stride + 2 * _LINE) // 8

    def slot(self, src: int, k: int) -> int:
        return self.data_off + (src * self.slots + k) * self.slot_size


class _Segment:
    """One mapped segment: its counters as an int64 memoryview, its bytes as a numpy uint8 array."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise HpcclSystemError(f"cannot {'create' if create else 'open'} shared memory {path}: "
                                   f"{exc.strerror}") from None
        try:
            if create:
                _live_paths.add(path)
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        except OSError as exc:
            raise HpcclSystemError(f"cannot size or map shared memory {path} ({size} bytes): "
                                   f"{exc.strerror}; is /dev/shm large enough?") from None
        finally:
            os.close(fd)
        self.q = memoryview(self.map).cast("q")
        self.u8 = np.frombuffer(self.map, dtype=np.uint8)

    def close(self) -> None:
        try:
            self.q.release()
            del self.u8
            self.map.close()
        except (BufferError, AttributeError):
            pass  # a view still exported; the mapping goes with the process


_P2P_MARK = 2  # in a chunk's last-chunk word: the chunk belongs to a point-to-point message

class _Channel:
    """One direction between this rank and a peer; counters and slots live in the receiver's segment."""

    def __init__(self, seg: _Segment, lay: _Layout, src: int) -> None:
        self.q = seg.q
        self.head, self.tail, self.lens = lay.head(src), lay.tail(src), lay.lens(src)
        self.K, self.S = lay.slots, lay.slot_size
        self.slots = [seg.u8[lay.slot(src, k):lay.slot(src, k) + self.S] for k in range(self.K)]
        self.queue: Deque["_ShmRequest"] = deque()


class _ShmRequest(Request):
    __slots__ = ("peer", "done", "u8", "typed", "op", "off", "chan", "send", "transport", "src", "mark")

    def __init__(self, transport: "ShmTransport", peer: int, buf: np.ndarray, op: Optional[ReduceOp],
                 send: bool, src: Optional[np.ndarray] = None, p2p: bool = False) -> None:
        self.transport, self.peer, self.send, self.op = transport, peer, send, op
        self.mark = _P2P_MARK if p2p else 0
        self.src = buf if src is None else src
        self.typed = buf
        self.u8 = buf.view(np.uint8)
        self.off = 0
        self.done = False
        self.chan = transport._out[peer] if send else transport._in[peer]
        self.chan.queue.append(self)

    def test(self) -> bool:
        if not self.done:
            q = self.chan.queue
            while q and (q[0]._send_progress() if self.send else q[0]._recv_progress()):
                q.popleft()
        return self.done

    def _send_progress(self) -> bool:
        c, q = self.chan, self.chan.q
        head = q[c.head]
        n = self.u8.size
        while head - q[c.tail] < c.K:
            k = head % c.K
            m = min(c.S, n - self.off)
            if m:
                c.slots[k][:m] = self.u8[self.off:self.off + m]
            self.off += m
            q[c.lens + k] = m
            last = self.off >= n
            q[c.lens + c.K + k] = (1 if last else 0) | self.mark
            head += 1
            q[c.head] = head
            if last:
                self.done = True
                return True
        return False

    def _recv_progress(self) -> bool:
        c, q = self.chan, self.chan.q
        tail = q[c.tail]
        n = self.u8.size
        while tail < q[c.head]:
            k = tail % c.K
            m = q[c.lens + k]
            last = (q[c.lens + c.K + k] & 1) == 1
            end = self.off + m
            if end > n or (last and end != n) or (not last and end >= n):
                self.transport._mismatch(self.peer, n, end, last)
            if m:
                src = c.slots[k][:m]
                if self.op is None:
                    self.u8[self.off:end] = src
                else:
                    isz = self.typed.itemsize
                    e0, e1 = self.off // isz, end // isz
                    UFUNC[self.op](self.src[e0:e1], src.view(self.typed.dtype), out=self.typed[e0:e1])
            self.off = end
            tail += 1
            q[c.tail] = tail
            if last:
                self.done = True
                return True
        return False


class ShmWindow(Window):
    """Each rank's window region, mapped in every local rank; barrier by per-rank counters."""

    def __init__(self, transport: "ShmTransport") -> None:
        self._t = transport
        lay = transport._lay
        self.size = lay.window
        self._bufs = {r: transport._segs[r].u8[lay.win_off:lay.win_off + lay.window]
                      for r in transport.ranks}
        self.phase = 0  # which half the next direct chunk uses; persists across calls
        self._peers: Optional[List[tuple]] = None
        self._me = None

    def buffer(self, rank: int) -> np.ndarray:
        return self._bufs[rank]

    def expose(self, arrays) -> None:
        """Publish where these arrays live in this process, for peers' single-copy reads."""
        q = self._t._segs[self._t.rank].q
        for k, a in enumerate(arrays):
            q[_I_EXPOSE + 2 * k] = a.ctypes.data
            q[_I_EXPOSE + 2 * k + 1] = a.nbytes

    def peer_read(self, rank: int, entry: int, offset: int, dst: np.ndarray) -> None:
        """dst = bytes [offset, offset + dst.nbytes) of the array ``rank`` exposed as ``entry``."""
        q = self._t._segs[rank].q
        addr, size = q[_I_EXPOSE + 2 * entry], q[_I_EXPOSE + 2 * entry + 1]
        if offset + dst.nbytes > size:
            from ..errors import HpcclInvalidUsage
            raise HpcclInvalidUsage(f"rank {rank}'s buffer has {size} bytes, this rank reads up to "
                                    f"{offset + dst.nbytes} (counts or dtypes differ across ranks)")
        cma.read(q[_I_PID], addr + offset, dst)

    def barrier(self, wait: Callable[[Callable[[], bool], List[int]], None]) -> None:
        if self._peers is None:
            t = self._t
            self._me = t._segs[t.rank].q
            self._peers = [(r, t._segs[r].q) for r in t.ranks if r != t.rank]
        me = self._me
        gen = me[_I_BARRIER] + 1
        me[_I_BARRIER] = gen
        peers = self._peers

        def ready() -> bool:
            for _, q in peers:
                if q[_I_BARRIER] < gen:
                    return False
            return True

        if not ready():
            wait(ready, [r for r, q in peers if q[_I_BARRIER] < gen])


TSO_MACHINES = ("x86_64", "amd64", "i386", "i686")


def ordering_problem() -> Optional[str]:
    """Why this CPU cannot run the shared-memory flag protocol, or None. The protocol publishes data, then
    a counter, with plain stores, and relies on x86-64's total store order; on weaker orders (aarch64,
    ppc64le) a peer could see the counter before the data, so hpccl refuses rather than risk wrong
    results until fenced stores are in place."""
    machine = platform.machine().lower()
    if machine in TSO_MACHINES:
        return None
    return (f"the shared-memory transport relies on x86-64's total store order and this CPU is "
            f"{platform.machine() or 'unknown'}; its peers on this node use MPI instead")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (dead, not yet reaped by its launcher)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no procfs: existence is all we can tell


class ShmTransport(Transport):
    """Shared-memory transport among the ranks of one node (``ranks`` are communicator ranks)."""

    name = "shm"

    def __init__(self, bootstrap, rank: int, ranks: List[int], tag: str) -> None:
        self.before_close: List[Any] = []  # readers of the segments on other threads (the GPU watchdog)
        self.rank, self.ranks = rank, list(ranks)
        self.local = self.ranks.index(rank)
        slot_size = config.get("HPCCL_SHM_SLOT_SIZE")
        if slot_size < 4096 or slot_size % 64:
            raise HpcclInvalidArgument("HPCCL_SHM_SLOT_SIZE", f"{slot_size} must be >= 4096 and a multiple of 64")
        self._lay = _Layout.configured(len(self.ranks))
        self.segment_bytes = self._lay.total
        base = f"/dev/shm/hpccl-{os.getuid()}-{tag}-"
        self._path = base + str(self.local)
        self._segs: Dict[int, _Segment] = {}
        try:
            me = self._segs[rank] = _Segment(self._path, self._lay.total, create=True)
            me.q[_I_MAGIC] = _MAGIC
            me.q[_I_PID] = os.getpid()
            me.q[_I_HDRADDR] = me.u8.ctypes.data
            me.q[_I_PROBE] = int.from_bytes(secrets.token_bytes(7), "little")
            bootstrap.barrier()
            for i, r in enumerate(self.ranks):
                if r != rank:
                    self._segs[r] = _Segment(base + str(i), self._lay.total, create=False)
            bootstrap.barrier()
        except BaseException:
            # a peer that died (or never came) after creating its segment cannot unlink it: the ranks
            # that are left unlink every segment of this set-up, theirs or not (names are per communicator)
            for i in range(len(self.ranks)):
                try:
                    os.unlink(base + str(i))
                except OSError:
                    pass
            for seg in self._segs.values():
                seg.close()
            raise
        finally:
            self._unlink()
        self.cma_ok = self._probe_cma()
        self._pids = {r: int(s.q[_I_PID]) for r, s in self._segs.items() if r != rank and _alive(int(s.q[_I_PID]))}
        self._in = {r: _Channel(self._segs[rank], self._lay, self.ranks.index(r)) for r in self.ranks}
        self._out = {r: _Channel(self._segs[r], self._lay, self.local) for r in self.ranks}
        self._window = ShmWindow(self)
        log.info("TRANSPORT", "shm: %d local ranks, %d B per segment (%d slots x %d B, window %d B)",
                 len(self.ranks), self._lay.total, self._lay.slots, slot_size, self._lay.window)

    def _probe_cma(self) -> bool:
        """Can this rank read its next local peer's memory directly (same user, ptrace allowed)?"""
        if not cma.available():
            return False
        peer = self.ranks[(self.local + 1) % len(self.ranks)]
        q = self._segs[peer].q
        why = cma.probe(q[_I_PID], q[_I_HDRADDR] + 8 * _I_PROBE, q[_I_PROBE])
        if why:
            log.info("TRANSPORT", "single-copy reads (process_vm_readv) unavailable: %s", why)
        return why is None

    @staticmethod
    def segment_size(nlocal: int) -> int:
        """Bytes of one rank's segment for ``nlocal`` ranks on the node, with the configured slots."""
        return _Layout.configured(nlocal).total

    @staticmethod
    def new_tag() -> str:
        return secrets.token_hex(6)

    def _unlink(self) -> None:
        if self._path in _live_paths:
            try:
                os.unlink(self._path)
            except OSError:
                pass
            _live_paths.discard(self._path)

    def _mismatch(self, peer: int, expected: int, got: int, last: bool) -> None:
        from ..errors import HpcclInvalidUsage
        raise HpcclInvalidUsage(
            f"message size mismatch with rank {peer}: this rank expects {expected} bytes, the peer's "
            f"message {'ends at' if last else 'runs past'} {got} bytes (counts or dtypes differ across ranks)")

    def isend(self, peer: int, buf: np.ndarray, p2p: bool = False) -> Request:
        return _ShmRequest(self, peer, buf, None, send=True, p2p=p2p)

    def irecv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp],
              src: Optional[np.ndarray] = None, p2p: bool = False) -> Request:
        return _ShmRequest(self, peer, buf, op, send=False, src=src)

    def probe(self, peer: int) -> bool:
        c = self._in[peer]
        q = c.q
        tail = q[c.tail]
        return not c.queue and q[c.head] > tail and bool(q[c.lens + c.K + tail % c.K] & _P2P_MARK)

    def window(self) -> Optional[Window]:
        return self._window

    def announce(self, seq: int) -> None:
        self._segs[self.rank].q[_I_ARRIVED] = seq

    def arrived(self, peer: int) -> Optional[int]:
        seg = self._segs.get(peer)
        return None if seg is None else seg.q[_I_ARRIVED]

    def device_counter(self) -> Any:
        """This rank's launch counter in its segment (the GPU engine stores its kernel count there)."""
        return self._segs[self.rank].q

    def hot_layout(self) -> tuple:
        """What the compiled hot path needs: every rank's segment address and process id (in rank order), the
        byte offsets of the arrival counter, the hot-path counter, the two slots and the direct broadcast's
        address and done words, and the bytes per slot."""
        lay = self._lay
        return ([self._segs[r].u8.ctypes.data for r in self.ranks], [int(self._segs[r].q[_I_PID]) for r in self.ranks],
                8 * _I_ARRIVED, 8 * _I_HOT, lay.hot_off, 8 * _I_HOTADDR, 8 * _I_HOTDONE, lay.hot)

    def gpu_error_word(self, peer: Optional[int] = None) -> int:
        """Address of this rank's (or local ``peer``'s) GPU error word (a u32 at the start of an int64 header
        slot, in the page of its GPU sync words)."""
        return self._segs[self.rank if peer is None else peer].u8.ctypes.data + 8 * _I_GPUERR

    def gpu_sync_address(self, peer: int) -> int:
        """Address, in this process, of ``peer``'s GPU sync words (hpccl/gpu/gpu_sync.py; in its header page,
        which the GPU engine registers with CUDA)."""
        return self._segs[peer].u8.ctypes.data + _B_GPUSYNC

    def device_counter_address(self) -> int:
        """Address of this rank's launch counter (for compiled replays: hpccl/torch/_native.cpp)."""
        return self._segs[self.rank].u8.ctypes.data + 8 * _I_DEVSEQ

    def launched(self, peer: int) -> Optional[int]:
        """How many GPU kernels ``peer`` has launched on this communicator, if it is on this node."""
        seg = self._segs.get(peer)
        return None if seg is None else int(seg.q[_I_DEVSEQ])

    def dead_peer(self) -> Optional[Tuple[int, str]]:
        """A local peer whose process no longer exists (or is a zombie): a dead rank is named at once, not
        after HPCCL_TIMEOUT. Peers whose pid this process cannot see (another pid namespace) are skipped."""
        for r, pid in self._pids.items():
            if not _alive(pid):
                return r, f"its process {pid} on this node exited"
        return None

    def peer_aborted(self) -> Optional[int]:
        for r, seg in self._segs.items():
            if r != self.rank and seg.q[_I_ABORT]:
                return int(seg.q[_I_ABORT]) - 1  # the rank that failed first
        return None

    def abort(self, origin: int) -> None:
        """Publish the failure (the origin first, so a rank woken by its GPU word can name it), then stop
        every local rank's GPU kernels, this rank's included (revoke: nothing left spinning before destroy)."""
        if self.rank in self._segs:
            self._segs[self.rank].q[_I_ABORT] = origin + 1
        for seg in self._segs.values():
            if seg.q[_I_GPUERR] == 0:
                seg.q[_I_GPUERR] = GPU_ERR_ABORT

    def close(self) -> None:
        for stop in self.before_close:
            stop()
        self.before_close = []
        self._unlink()
        self._in = self._out = {}
        self._window = None
        for seg in self._segs.values():
            seg.close()
        self._segs = {}
