"""The memory a GPU network step is staged in and the words it is ordered by: pinned, device-mapped host
allocations (_Pinned), the counters one communicator's steps share with the C replay (NetState), the kernels'
wait limits (_put_limit), and what outlives a destroyed communicator (ORPHANS: captured steps' words and
staging, answered at each late replay, and memory an engine that stopped may still write)."""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, List, Optional, Sequence

from .. import log
from .netplan import MAX_LANES

WAIT_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ (wrap-around safe)
_WORDS = 1024  # done words per page of pinned words (one per captured step)
NO_STREAM = (1 << 64) - 1



class NetState(ctypes.Structure):
    """Counters of one communicator's eager network steps, shared with the C replay of recorded calls
    (hpccl/csrc/_netreplay.c, net_state: keep the layouts equal): ready tokens written, the stream of the latest
    call, whether the join event was recorded after it, and per lane the done values handed out."""
    _fields_ = [("tok", ctypes.c_uint32), ("_pad0", ctypes.c_uint32), ("last_stream", ctypes.c_uint64),
                ("joinable", ctypes.c_int32), ("_pad1", ctypes.c_int32), ("val", ctypes.c_uint32 * MAX_LANES)]


def new_state() -> NetState:
    st = NetState()
    st.last_stream = NO_STREAM
    return st


class _Pinned:
    """One pinned, device-mapped host allocation."""

    def __init__(self, driver: Any, nbytes: int) -> None:
        self.driver = driver
        self.nbytes = max(nbytes, 64)
        self.host = driver.host_alloc(self.nbytes)
        self.dev = driver.host_device_pointer(self.host)

    def free(self) -> None:
        if self.host:
            self.driver.mem_free_host(ctypes.c_void_p(self.host))
            self.host = 0


def _put_limit(addr: int, ns: int) -> None:
    """A kernel wait's limit in nanoseconds, as two 32-bit words at ``addr`` (low first: hp_net_wait)."""
    ctypes.c_uint32.from_address(addr).value = ns & 0xFFFFFFFF
    ctypes.c_uint32.from_address(addr + 4).value = ns >> 32


class _Orphans:
    """Captured steps of destroyed communicators. Replaying a graph after its communicator is destroyed is
    an error (as with NCCL), but it must not hang nor write freed memory: the steps' words and staging stay
    allocated until the process ends, and a thread answers each replay's arm word with done := 1 (nothing
    moves, the stream goes on) and logs the error once per communicator."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._words: List[tuple] = []  # (arm, done, index of the communicator's entry in _seen)
        self._keep: List[Any] = []
        self._seen: List[bool] = []
        self._thread: Optional[Any] = None

    def adopt(self, armed: List[tuple], keep: List[Any]) -> None:
        """Take one communicator's (arm, done) words and what its graphs point into."""
        with self._lock:
            k = len(self._seen)
            self._seen.append(False)
            self._words.extend((a, d, k) for a, d in armed)
            self._keep.extend(keep)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hpccl-orphan-graphs", daemon=True)
                self._thread.start()

    def keep(self, what: Sequence[Any]) -> None:
        """Keep memory a captured graph points into (hier's temporaries) until the process ends."""
        with self._lock:
            self._keep.extend(what)

    def answer(self) -> int:
        """One pass over the arm words: each set one is cleared and its done word set; how many were."""
        n = 0
        with self._lock:
            for arm, done, k in self._words:
                if ctypes.c_uint32.from_address(arm).value:
                    ctypes.c_uint32.from_address(arm).value = 0
                    ctypes.c_uint32.from_address(done).value = 1
                    n += 1
                    if not self._seen[k]:
                        self._seen[k] = True
                        log.warn("NET", "a CUDA graph captured with a communicator was replayed after the "
                                 "communicator was destroyed: its network steps moved nothing (destroy a "
                                 "communicator after the last replay of the graphs captured with it)")
        return n

    def _run(self) -> None:
        """Polls every millisecond for a second after a replay it answered, every 20 ms otherwise (an
        orphaned graph's replay then waits that long, once: it is an error whose work is void anyway)."""
        last = 0.0
        while True:
            if self.answer():
                last = time.monotonic()
            time.sleep(0.001 if time.monotonic() - last < 1.0 else 0.02)


ORPHANS = _Orphans()
