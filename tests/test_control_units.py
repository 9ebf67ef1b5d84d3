"""The control channel's survey and the waiter's timeout, in one process over an in-memory wire: who a
timed-out rank names, and whom its abort blames (the CI failure of 2026-12-02: two survivors timing out
more than a survey apart each named the other as missing)."""
from __future__ import annotations

from collections import deque
from typing import Dict, List

import numpy as np
import pytest

from hpccl.errors import HpcclTimeoutError
from hpccl.runtime.progress import Waiter
from hpccl.transport.control import ABORT, ControlChannel


class Wire:
    """Inboxes of 3 ranks; a rank that is 'stopped' neither polls nor answers."""

    def __init__(self, n: int) -> None:
        self.inbox: Dict[int, deque] = {r: deque() for r in range(n)}


class Fake(ControlChannel):
    def __init__(self, wire: Wire, rank: int, size: int) -> None:
        self.wire, self.rank, self.size = wire, rank, size
        self._control_init()

    def _ctrl_live(self) -> bool:
        return True

    def _ctrl_send(self, peer: int, msg: np.ndarray):
        self.wire.inbox[peer].append(msg.copy())
        return True

    @staticmethod
    def _ctrl_done(req) -> bool:
        return True

    def _ctrl_arrived(self):
        box = self.wire.inbox[self.rank]
        while box:
            yield box.popleft()


def _three(seq: int = 7) -> List[Fake]:
    wire = Wire(3)
    ranks = [Fake(wire, r, 3) for r in range(3)]
    for t in ranks:
        t.announce(seq)
    return ranks


def test_a_peer_that_asked_first_and_left_counts_as_arrived():
    """Rank 1 is stopped. Rank 2 times out first and asks; rank 0 (still waiting) answers it while it
    polls, then times out itself after rank 2 has gone: rank 0 must name only rank 1."""
    r0, _r1, r2 = _three()
    r2.survey([0, 1], 0.02)  # rank 0 has not polled yet: rank 2 hears nobody
    assert r2.arrived(0) is None and r2.arrived(1) is None
    assert r0.peer_aborted() is None  # rank 0's wait polls: it answers rank 2 and learns where rank 2 is
    assert r0.arrived(2) == 7
    r0.survey([1, 2], 0.02)  # rank 2 has left; its question still counts
    assert r0.arrived(2) == 7 and r0.arrived(1) is None
    w = Waiter(1.0, 0, [1, 2], r0.arrived, r0.peer_aborted, lambda *a: None)
    w.seq = 7
    assert w.missing([2], surveyed=True) == [1]


def test_a_rank_stuck_in_an_earlier_call_is_not_blamed_when_another_is_silent():
    """Rank 2 answers from call 6 (it waits there on rank 1, which stopped); rank 0 is in call 7. Rank 1
    never answers: it is the one named. With nobody silent, the rank behind is named."""
    r0, r1, r2 = _three()
    r2.announce(6)
    r0.survey([1, 2], 0.01)
    r2.peer_aborted()  # rank 2, one call behind, answers; rank 1 is stopped
    r0.survey([1, 2], 0.02)
    assert r0.arrived(2) == 6 and r0.arrived(1) is None
    w = Waiter(1.0, 0, [1, 2], r0.arrived, r0.peer_aborted, lambda *a: None)
    w.seq = 7
    assert w.missing([2], surveyed=True) == [1]
    r1.peer_aborted()  # now rank 1 answers too (from call 7): only rank 2 is behind
    r0.survey([1, 2], 0.02)
    assert w.missing([2], surveyed=True) == [2]


@pytest.mark.parametrize("silent,blamed", [([1], 1), ([1, 2], None)])
def test_a_timeout_aborts_naming_the_one_missing_rank(silent, blamed):
    """The rank at fault travels with the abort when the survey found exactly one; with several missing
    the timed-out rank names itself (peers then read the missing ranks from its message)."""
    r0, r1, r2 = _three()
    if 2 not in silent:
        r2.survey([0], 0.0)  # rank 2 is alive and asks: rank 0 will hear it
    failed: List = []
    w = Waiter(0.05, 0, [1, 2], r0.arrived, r0.peer_aborted, lambda origin=None: failed.append(origin),
               survey=lambda: (r0.survey([1, 2], 0.02), True)[1])
    w.collective, w.seq = "all_reduce", 7
    with pytest.raises(HpcclTimeoutError) as info:
        w.wait(lambda: False, [1])
    assert info.value.missing == sorted(silent)
    assert failed == [blamed]


def test_peers_hear_the_blamed_rank_in_the_abort():
    r0, _r1, r2 = _three()
    r0.abort(1)
    assert r2.peer_aborted() == 1
    msg = np.array([ABORT, 0, 7], dtype=np.int64)  # a second abort does not replace the first origin
    r2.wire.inbox[2].append(msg)
    assert r2.peer_aborted() == 1
