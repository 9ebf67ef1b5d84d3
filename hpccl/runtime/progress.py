"""Waiting without hanging: spin, then yield, then sleep; give up after HPCCL_TIMEOUT naming who is missing."""
from __future__ import annotations

import os
import time
from typing import Callable, List, Optional, Tuple, Union

Peers = Union[List[int], Callable[[], List[int]]]

from ..errors import HpcclRemoteError, HpcclTimeoutError

YIELD_S = 2e-3  # seconds of yielding before a waiting rank starts to sleep
DEATH_CHECK_S = 0.02  # how often a waiting rank looks for peers whose process is gone


class Waiter:
    """Shared by one communicator's primitives; knows the current collective for error messages."""

    def __init__(self, timeout: float, spin: int, ranks: List[int],
                 arrived: Callable[[int], Optional[int]],
                 peer_aborted: Callable[[], Optional[int]],
                 on_fail: Callable[..., None], survey: Optional[Callable[[], bool]] = None,
                 dead_peer: Optional[Callable[[], Optional[Tuple[int, str]]]] = None) -> None:
        self.timeout, self.spin = timeout, spin
        self.ranks = ranks  # every other rank of the communicator
        self._arrived, self._peer_aborted, self._on_fail = arrived, peer_aborted, on_fail
        self._survey = survey  # at a timeout: ask peers no transport can see; True if it asked
        self._dead_peer = dead_peer
        self._next_death_check = 0.0
        self.collective, self.seq = "idle", 0
        # a timeout aborts naming the one missing rank; a hier step's Waiter leaves that to its parent, which
        # asks its peers first (the rank a step waited for may itself be waiting, in another step)
        self.abort_on_timeout = True

    def wait(self, ready: Callable[[], bool], peers: Peers) -> None:
        """Return when ready() is true; raise HpcclTimeoutError / HpcclRemoteError instead of hanging.

        Spin first (cheapest when every rank has a core), then yield the core for up to YIELD_S (lets an
        oversubscribed peer run at once), then sleep with growing naps so a long wait costs no CPU."""
        for _ in range(self.spin):
            if ready():
                return
        start = time.monotonic()
        polls = 0
        nap = 2e-5
        while not ready():
            polls += 1
            if polls & 15:
                os.sched_yield()
                continue
            now = time.monotonic()
            if now - start > YIELD_S:
                time.sleep(nap)
                nap = min(nap * 2, 2e-4)
            self._check(start, peers)

    def _check(self, start: float, peers: Peers) -> None:
        bad = self._peer_aborted()  # first: a peer that aborted says who failed first, even if it has exited
        if bad is not None:
            self._on_fail(bad)  # passed on: every rank names the rank that failed first
            awaited = sorted(set(peers() if callable(peers) else peers))
            late = [p for p in self.ranks if (s := self._arrived(p)) is not None and s < self.seq]
            raise HpcclRemoteError.aborted(self.collective, self.seq, bad, awaited,
                                           f"; rank(s) not arrived: {late}" if late else "")
        now = time.monotonic()
        if self._dead_peer is not None and now >= self._next_death_check:
            self._next_death_check = now + DEATH_CHECK_S
            dead = self._dead_peer()
            if dead is not None and self._peer_aborted() is not None:
                return self._check(start, peers)  # it aborted before it went: name whom it named
            if dead is not None:
                self._on_fail(dead[0])
                raise HpcclRemoteError.died(self.collective, self.seq, dead[0], dead[1],
                                            sorted(set(peers() if callable(peers) else peers)))
        if time.monotonic() - start > self.timeout:
            missing = self.missing(peers, surveyed=bool(self._survey and self._survey()))
            if self.abort_on_timeout:
                # one rank missing is the rank at fault: peers that hear this abort name it, not this rank
                self._on_fail(missing[0] if len(missing) == 1 else None)
            raise HpcclTimeoutError(self.collective, self.seq, missing, self.timeout)

    def missing(self, peers: Peers, surveyed: bool = False) -> List[int]:
        """Ranks that have not entered the current collective: every rank whose arrival counter is visible
        (same node) and behind, plus awaited ranks nobody can see; the awaited ranks if that is empty.
        After a survey every rank is visible or silent. Silent ranks (stopped, dead, busy outside hpccl)
        are the ones at fault; a rank that answered from an earlier call is itself stuck waiting (on them)
        and is named only when nobody is silent."""
        peers = peers() if callable(peers) else peers
        late = [p for p in self.ranks if (s := self._arrived(p)) is not None and s < self.seq]
        if surveyed:
            silent = [p for p in self.ranks if self._arrived(p) is None]
            return silent or late or sorted(set(peers))
        unseen = [p for p in peers if self._arrived(p) is None]
        return sorted(set(late + unseen)) or sorted(set(peers))
