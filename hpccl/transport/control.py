"""A transport's control channel, for transports that cannot see their peers' state in shared memory (MPI,
UCX): small [kind, rank, seq] messages that carry an abort (with the rank that failed first) and, at a
timeout, "which call are you in?" and its answer. Ranks handle them whenever a wait polls (peer_aborted),
so a blocked rank still answers. A transport supplies how to send one message, which messages arrived,
whether a send is done, and whether it is still open."""
from __future__ import annotations

import time
from typing import Any, Iterator, List, Optional

import numpy as np

ABORT, QUERY, ANSWER = 1, 2, 3


class ControlChannel:
    """The shared protocol; mixed into a Transport before it (its methods replace the base's no-ops)."""

    rank: int
    size: int

    def _control_init(self) -> None:
        self._seq = 0
        self._aborted_by: Optional[int] = None
        self._seen: dict = {}  # peer -> the latest sequence number it asked or answered with (they only grow)
        self._heard: set = set()  # peers that asked or answered since the current survey began
        self._ctrl_sends: list = []  # (request, message) in flight: the message lives until the send is done

    # ----- what a transport supplies ------------------------------------------------------------------
    def _ctrl_live(self) -> bool:
        raise NotImplementedError

    def _ctrl_send(self, peer: int, msg: np.ndarray) -> Any:
        """Start sending msg to peer; the request, or None when the peer cannot be reached."""
        raise NotImplementedError

    def _ctrl_done(self, req: Any) -> bool:
        raise NotImplementedError

    def _ctrl_arrived(self) -> Iterator[Optional[np.ndarray]]:
        """The control messages that have arrived (None for one that carried nothing)."""
        raise NotImplementedError

    # ----- the protocol -------------------------------------------------------------------------------
    def _post(self, peer: int, kind: int, who: Optional[int] = None) -> None:
        msg = np.array([kind, self.rank if who is None else who, self._seq], dtype=np.int64)
        req = self._ctrl_send(peer, msg)
        if req is not None:
            self._ctrl_sends.append((req, msg))

    def _poll(self) -> None:
        """Handle every control message that has arrived: record aborts and answers, answer queries."""
        if not self._ctrl_live():
            return
        for msg in self._ctrl_arrived():
            if msg is None:
                continue
            kind, peer, seq = (int(v) for v in msg)
            if kind == ABORT and self._aborted_by is None:
                self._aborted_by = peer
            elif kind in (QUERY, ANSWER):  # a peer that asks is alive and waiting in its call too
                if kind == QUERY:
                    self._post(peer, ANSWER)
                self._seen[peer] = max(seq, self._seen.get(peer, seq))
                self._heard.add(peer)
        self._ctrl_sends = [(r, m) for r, m in self._ctrl_sends if not self._ctrl_done(r)]

    def announce(self, seq: int) -> None:
        self._seq = seq

    def peer_aborted(self) -> Optional[int]:
        self._poll()
        return self._aborted_by

    def arrived(self, peer: int) -> Optional[int]:
        return self._seen.get(peer)

    def survey(self, peers: List[int], seconds: float) -> None:
        """Ask these peers which collective they are in (ranks blocked in an hpccl wait answer while they
        poll); arrived() then reports the latest call each peer answered or asked from (a peer that timed out
        first and asked us has arrived even if it has left by now). A peer never heard from (stopped, dead,
        or busy outside hpccl) stays unknown, which the waiter counts as not arrived."""
        if not self._ctrl_live():
            return
        peers = [p for p in peers if p != self.rank]
        self._heard = set()
        for p in peers:
            self._post(p, QUERY)
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(p not in self._heard for p in peers):
            self._poll()
            time.sleep(1e-3)

    def abort(self, origin: int) -> None:
        """Tell every peer rank ``origin`` failed (a message each), and progress them out for a moment so
        they leave before this rank moves on."""
        if not self._ctrl_live():
            return
        for p in range(self.size):
            if p != self.rank:
                self._post(p, ABORT, origin)
        end = time.monotonic() + 0.1
        while self._ctrl_sends and time.monotonic() < end:
            self._poll()
