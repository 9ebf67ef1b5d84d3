"""How a single-node GPU communicator fails: the error word its kernels poll, what an error set there means
(an abort, a dead or stuck peer, a failed network step, mismatched registrations) and the exception each
raises, naming the rank at fault. Mixed into CudaComm (hpccl/gpu/cuda_comm.py), whose state it reads."""
from __future__ import annotations

import ctypes
import time
from typing import Any, List, Optional, Tuple

from .. import config, log
from . import gpu_sync
from ..errors import HpcclInvalidUsage, HpcclRemoteError, HpcclSystemError, HpcclTimeoutError
from ..kernels import ERR_ABORT, ERR_DEAD, ERR_MISMATCH, ERR_NET, ERR_PEER, ERR_TIMEOUT
from ..runtime.failures import first_within


class CudaFailures:
    """The failure side of CudaComm: its error word, the checks before a call and the errors after one."""

    def _error_word(self, shm: Any) -> Tuple[int, int, int, str]:
        """(host address, device address, registered page or 0, "shared"/"private") of the word this
        rank's kernels poll. Shared: in this rank's shared-memory header, where any local rank's abort
        writes it, so peers' kernels exit at once. Private (no shared-memory transport, or the page cannot
        be registered): a pinned word of this process; peers' kernels then end only at their timeout."""
        if shm is not None:
            host = shm.gpu_error_word()
            page = host & ~4095
            try:
                self.driver.host_register(page, 4096)
                return host, self.driver.host_device_pointer(host), page, "shared"
            except HpcclSystemError as exc:
                log.warn("INIT", "GPU abort word stays private (%s): a peer's abort will not stop this "
                         "rank's kernels before HPCCL_TIMEOUT", exc)
        import cupy
        rt = cupy.cuda.runtime
        host = rt.hostAlloc(64, rt.hostAllocMapped | rt.hostAllocPortable)
        ctypes.memset(host, 0, 64)
        self._private_err = host
        return host, host, 0, "private"

    def _check(self, what: str) -> None:
        if self._closed:
            raise HpcclInvalidUsage(f"{what} called after the communicator was destroyed")
        if self._failed:
            raise HpcclInvalidUsage(f"{what} called on an aborted communicator (an earlier GPU op failed)")
        if self._err.value:
            self._fail(what)

    def _fail(self, what: str) -> None:
        code = self._err.value
        self._failed = True
        self.fs.live = 0
        self.drop()
        origin = self.comm._peer_aborted() if code == ERR_ABORT else None
        if code == ERR_DEAD and self.watchdog.dead is not None:
            origin = self.watchdog.dead[0]  # the peers hear of the dead rank, not of this survivor
        if code == ERR_NET or code >= ERR_PEER:
            # a network step of this rank (ERR_NET) or of a local peer (ERR_PEER + k) failed before this
            # rank's kernels: name the rank whose failure the abort that follows it carries
            origin = self._heard_origin(None if code == ERR_NET else code - ERR_PEER)
            if origin is None and code == ERR_NET:
                # met before this rank's host looked at its network step (a hier step enqueued after it,
                # whose enqueue checks this word): the parent's watch sees why that step failed
                origin = self.comm._seen_failure(0.5)
        try:
            self.comm.abort(origin)
        except Exception:  # noqa: BLE001
            pass
        if code == ERR_ABORT:
            if origin is None:  # this rank's own abort (revoke) stopped its kernels
                raise HpcclInvalidUsage(f"{what}: the communicator was aborted on this rank; its GPU work "
                                        "was stopped")
            behind = self.never_launched()
            others = [p for p in range(self.comm.size) if p != self.comm.rank]
            raise HpcclRemoteError.aborted(self._what if what == "synchronize" else what, self.fs.seq, origin,
                                           behind or others,
                                           f"; rank(s) that never launched it: {behind}" if behind else "")
        if code == ERR_NET or code >= ERR_PEER:
            call = self._what if what == "synchronize" else what
            if origin is not None and origin != self.comm.rank:
                raise HpcclRemoteError.aborted(call, self.fs.seq, origin, [origin], "; its node step did not run "
                                               "on data that was not whole")
            raise HpcclSystemError(f"{call}: a network step of this node failed before it (synchronize() "
                                   "raises that step's error); its node step did not run")
        if code == ERR_MISMATCH:
            raise HpcclInvalidUsage(f"{self._what if what == 'synchronize' else what}: the ranks called it "
                                    "on registered buffers that differ (registration, offset, size, root or "
                                    "collective); every rank must pass the same registration at the same "
                                    "offset, or none")
        if code == ERR_DEAD and self.watchdog.dead is not None:
            dead, why = self.watchdog.dead
            raise HpcclRemoteError.aborted(self._what if what == "synchronize" else what, self.fs.seq, dead, [dead],
                                           f"; rank {dead} died ({why})")
        if code == ERR_TIMEOUT:
            missing, detail = self.stuck_ranks()
            raise HpcclTimeoutError(self._what if what == "synchronize" else what, self.fs.seq, missing,
                                    config.get("HPCCL_TIMEOUT"), detail)
        raise HpcclSystemError(f"GPU collective failed with device error code {code}")

    def _heard_origin(self, peer: Optional[int]) -> Optional[int]:
        """The rank the abort that follows a failed network step names: for a local peer's step (``peer``)
        waited for a moment (that rank aborts right after its engine set its word), else ``peer`` itself;
        for this rank's own step only what has been heard already (its own host aborts after this)."""
        r = first_within(1.0 if peer is not None else 0.0, self.comm._peer_aborted)
        return r if r is not None else peer

    def stuck_ranks(self) -> Tuple[List[int], str]:
        """Who a timed-out GPU call waited for, read from the node's shared memory: ranks that never launched
        the call; else (stream-synchronised protocol) ranks whose stream is not inside an hpccl call (their
        busy word is clear: the stream is held by earlier work); else every peer, each waiting too (a call
        differs, or the GPU runs none of their kernels)."""
        behind = self.never_launched()
        if behind:
            return behind, "a GPU wait for a peer timed out; these ranks never launched that call"
        peers = [p for p in range(self.size) if p != self.rank]
        if self.words is not None:
            state = gpu_sync.progress(self._shm, self.size)
            idle = [p for p in peers if p in state and not state[p][1]]
            if idle:
                return idle, ("every rank launched the call, but these ranks' streams have not reached it "
                              "(held by earlier work on them)")
            return peers, ("every rank launched the call and every rank's stream is waiting in it: the ranks "
                           "called different collectives or sizes, or the GPU ran none of their kernels")
        return peers, ("a GPU kernel's wait for a peer's flag timed out; every rank launched the call, so a "
                       "GPU stalled or the ranks' calls differ")

    def wait_idle(self) -> None:
        """Until this engine's latest launch has run, or its error word is set (a timeout or an abort that the
        watchdog saw: the stream may then never get the GPU back, so nothing here waits on it)."""
        if not self.fs.tail_live or self._closed:
            return
        delay = 2e-5
        while self.driver.event_query(self._tail_h) == 600 and not self._err.value:  # CUDA_ERROR_NOT_READY
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)

    def never_launched(self) -> List[int]:
        """Ranks on this node whose published launch count is behind this rank's: they never made the
        call this rank's kernel waited in (read from their shared-memory segments)."""
        if self._shm is None:
            return []
        return [p for p in range(self.comm.size)
                if p != self.comm.rank and (n := self._shm.launched(p)) is not None and n < self.fs.seq]
