"""The one small interface every transport implements, so algorithms never see a transport."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..ops import ReduceOp


class Request(ABC):
    """One posted send or receive; ``test()`` advances it and says whether it has completed."""

    peer: int

    @abstractmethod
    def test(self) -> bool:
        ...


class Window(ABC):
    """Memory every rank of a communicator can load and store directly (shared memory, GPU peer memory)."""

    size: int  # bytes per rank

    @abstractmethod
    def buffer(self, rank: int) -> np.ndarray:
        """The uint8 window of ``rank`` (this rank's own for rank == self)."""

    def expose(self, arrays) -> None:
        """Publish this rank's arrays for peers' single-copy reads (windows that support it)."""
        raise NotImplementedError

    def peer_read(self, rank: int, entry: int, offset: int, dst: np.ndarray) -> None:
        """Copy part of an array ``rank`` exposed straight into dst (windows that support it)."""
        raise NotImplementedError

    @abstractmethod
    def barrier(self, wait: Callable[[Callable[[], bool], List[int]], None]) -> None:
        """Return once every rank has entered this barrier (stores before it are visible after it)."""


class Transport(ABC):
    """Point-to-point messaging with a peer set. Messages on one (sender, receiver) pair match in order."""

    name = "base"

    @abstractmethod
    def isend(self, peer: int, buf: np.ndarray, p2p: bool = False) -> Request:
        """Post a send of ``buf`` (1-D, contiguous); the caller keeps it alive until the request completes.
        ``p2p``: a point-to-point message (send/recv), which probe() and a receive from any source can see."""

    @abstractmethod
    def irecv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp],
              src: Optional[np.ndarray] = None, p2p: bool = False) -> Request:
        """Post a receive into ``buf``; with ``op``, buf = (src if given, else buf) op incoming."""

    def probe(self, peer: int) -> bool:
        """True when the next message ``peer`` sends this rank is a point-to-point one that has started to
        arrive, with no receive of it posted (receive from any source picks its sender this way)."""
        from ..errors import HpcclUnsupported
        raise HpcclUnsupported(f"receive from any source: the {self.name} transport cannot probe for messages")

    def window(self) -> Optional[Window]:
        """A directly mapped window shared by all ranks of the communicator, when the transport has one."""
        return None

    def arrived(self, peer: int) -> Optional[int]:
        """Sequence number of the last collective ``peer`` entered, if this transport can see it."""
        return None

    def announce(self, seq: int) -> None:
        """Publish that this rank entered collective ``seq`` (for timeout diagnostics)."""

    def peer_aborted(self) -> Optional[int]:
        """A peer that aborted the communicator, if this transport can see one."""
        return None

    def dead_peer(self) -> Optional[Tuple[int, str]]:
        """A peer whose process is gone, as (rank, how this transport knows), if this transport can tell."""
        return None

    def survey(self, peers: List[int], seconds: float) -> None:
        """At a timeout, learn (for arrived()) which collective peers this transport cannot see are in."""

    def abort(self, origin: int) -> None:
        """Tell peers rank ``origin`` failed (this rank, or the one whose abort it passes on), so they fail
        fast instead of waiting for the timeout."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource (mappings, segments, endpoints); idempotent."""
