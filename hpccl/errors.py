"""hpccl's exceptions: one base class, one subclass per kind of failure, each with a stable code."""
from __future__ import annotations

from typing import Iterable, List, Optional


class HpcclError(RuntimeError):
    """Base of every hpccl error; ``code`` is stable across releases (like ncclResult_t)."""

    code = 1

    def __init__(self, message: str) -> None:
        super().__init__(f"[hpccl E{self.code}] {message}")
        self.message = message


class HpcclInvalidArgument(HpcclError, ValueError):
    """A call's argument is wrong (dtype, op, size, root, peer, buffer); raised before any data moves."""

    code = 2

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"argument '{argument}': {message}")
        self.argument = argument


class HpcclInvalidUsage(HpcclError):
    """The call is not allowed in this state (destroyed communicator, unmatched group end)."""

    code = 3


class HpcclTimeoutError(HpcclError, TimeoutError):
    """Peers did not arrive within HPCCL_TIMEOUT; names the collective, its sequence number and the ranks."""

    code = 4

    def __init__(self, collective: str, seq: int, missing: Iterable[int], timeout: float,
                 detail: str = "", after: str = "the communicator is now aborted") -> None:
        self.collective = collective
        self.seq = seq
        self.missing = sorted(set(missing))
        self.timeout, self.detail = timeout, detail
        extra = f" ({detail})" if detail else ""
        who = f"rank(s) {self.missing}" if self.missing else "rank(s) MPI cannot name"
        super().__init__(
            f"{collective} #{seq} timed out after {timeout:g}s waiting for {who}{extra}; {after}")


class HpcclSystemError(HpcclError):
    """The operating system or a library refused (shared memory, MPI, CUDA, UCX)."""

    code = 5


class HpcclEnvironmentError(HpcclError):
    """The environment cannot support hpccl as configured (/dev/shm too small, memlock, no P2P)."""

    code = 6


class HpcclUnsupported(HpcclError, NotImplementedError):
    """The combination asked for exists in the API but not for this memory kind or transport."""

    code = 7


class HpcclRemoteError(HpcclError):
    """A peer aborted the communicator; this rank stops instead of waiting forever. ``rank`` is the rank
    that failed first (when known), ``collective``/``seq`` the call this rank was in; ``how``: how that rank
    died, when this rank saw it die (its process gone, its connection lost), else empty."""

    code = 8

    def __init__(self, message: str, rank: Optional[int] = None, collective: str = "", seq: int = 0,
                 awaited: Optional[List[int]] = None) -> None:
        super().__init__(message)
        self.rank, self.collective, self.seq, self.awaited = rank, collective, seq, awaited or []
        self.how = ""

    @classmethod
    def died(cls, collective: str, seq: int, rank: int, how: str, awaited: List[int],
             note: str = "") -> "HpcclRemoteError":
        exc = cls(f"{collective} #{seq}: rank {rank} died ({how}); this rank was waiting on rank(s) {awaited}{note}",
                  rank, collective, seq, awaited)
        exc.how = how
        return exc

    @classmethod
    def aborted(cls, collective: str, seq: int, rank: int, awaited: List[int],
                note: str = "") -> "HpcclRemoteError":
        return cls(f"{collective} #{seq}: rank {rank} failed and the communicator was aborted (this rank was "
                   f"waiting on rank(s) {awaited}{note})", rank, collective, seq, awaited)
