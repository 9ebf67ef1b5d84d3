"""Rank numbering of failures in hier layouts, in one process with stand-in communicators (hpccl/runtime/failures.py):
a rank crossing a sub-communicator's boundary is mapped exactly once, whichever way and however often the
error passes, and an abort carries its origin in the numbering of the transports it travels on. The case of
issue 32: at 3 nodes x 2, a rank's error that crossed the 'inter' boundary was mapped again through the
2-rank 'intra' table (IndexError instead of an HpcclError)."""
from __future__ import annotations

import types
from typing import List, Optional

import pytest

from hpccl.runtime import failures
from hpccl.errors import HpcclRemoteError, HpcclSystemError, HpcclTimeoutError
from hpccl.runtime.failures import named, origin, to_user, user_rank, wire_rank
from hpccl.runtime.progress import Waiter
from hpccl.transport.base import Transport


class Wire(Transport):
    """A transport that only carries aborts: what peer_aborted() reports, and the origins it was told."""

    isend = irecv = close = None  # never called

    def __init__(self, name: str = "base") -> None:
        self.name = name
        self.heard: Optional[int] = None
        self.dead = None
        self.told: List[int] = []

    def peer_aborted(self) -> Optional[int]:
        return self.heard

    def dead_peer(self):
        return self.dead

    def abort(self, origin: int) -> None:
        self.told.append(origin)


class Comm:
    """The fields failures.py reads of a communicator (a hier parent or one of its sub-communicators)."""

    def __init__(self, rank: int, size: int, parent: "Comm" = None, parent_ranks: List[int] = None,
                 step: str = "") -> None:
        self.rank, self.size, self._parent, self.parent_ranks = rank, size, parent, parent_ranks
        self._numbering = failures.new_numbering()
        self._transports = [Wire()]
        self._sub = {}
        self._aborted, self._seq, self._dev = False, 0, None
        self._planner = types.SimpleNamespace(close=lambda: None)
        self._rec = types.SimpleNamespace(dump=lambda *a: None, step=lambda: step or None)
        self._waiter = types.SimpleNamespace(collective="all_reduce", ranks=[q for q in range(size) if q != rank],
                                             missing=lambda peers, surveyed=False: list(peers))

    def abort(self, origin: Optional[int] = None) -> None:
        failures.abort(self, origin)

    @property
    def told(self) -> List[int]:
        return self._transports[0].told


def _rank5_of_3x2():
    """Rank 5 of 6 ranks in nodes of 2 ({0,1}, {2,3}, {4,5}): its 'intra' [4, 5] (rank 1 there) and its
    'inter' [1, 3, 5] (rank 2 there), both in the middle of step calls of the user's all_reduce #6."""
    user = Comm(5, 6, step="step 2 (inter all_reduce)")
    user._seq = 6
    intra = Comm(1, 2, user, [4, 5])
    inter = Comm(2, 3, user, [1, 3, 5])
    user._sub = {"intra": intra, "inter": inter}
    intra._seq, inter._seq = 11, 6  # the sub-communicators' own counts
    return user, intra, inter


def test_ranks_between_numberings():
    assert [user_rank([1, 3, 5], r) for r in (0, 1, 2)] == [1, 3, 5]
    assert [wire_rank([1, 3, 5], u) for u in (1, 3, 5)] == [0, 1, 2]
    # a rank outside the sub-communicator travels as -(u+2) and comes back as itself
    assert wire_rank([4, 5], 3) == -5 and user_rank([4, 5], -5) == 3
    assert all(user_rank([4, 5], wire_rank([4, 5], u)) == u for u in range(6))
    # a communicator the user made: its numbering is the user's
    assert wire_rank(None, 3) == 3 and user_rank(None, 3) == 3
    # no rank: None, -1 (the engine's "none"), out of range: None, never an IndexError
    assert [user_rank([4, 5], r) for r in (None, -1, 2, 7)] == [None, None, None, None]
    assert user_rank(None, -5) is None


def test_a_step_error_is_mapped_once_whatever_it_crosses():
    """Issue 32's IndexError: the inter step's error names inter rank 1 (user rank 3); it leaves the inter
    sub-communicator's call mapped, then the user's call names it; passing any boundary again (the same
    one, the other sub-communicator's, the user's) changes nothing."""
    user, intra, inter = _rank5_of_3x2()
    raw = HpcclRemoteError("UCX transfer with rank 1 failed: rank 1 is gone", rank=1)  # a transport's words
    step = named(inter, raw, "all_reduce")
    assert step.rank == 3 and step.collective == "all_reduce" and step.seq == 6 and step.from_step
    assert to_user(inter, step) is step and to_user(intra, step) is step and to_user(user, step) is step
    assert named(inter, step, "all_reduce").rank == 3 and named(intra, step, "all_gather").rank == 3
    call = named(user, step, "all_reduce")
    assert call.rank == 3 and "all_reduce #6: rank 3 failed" in str(call), str(call)
    assert "in its hierarchical step 2 (inter all_reduce)" in str(call)
    assert named(user, call, "all_reduce") is call


def test_abort_origins_travel_in_the_numbering_of_their_wire():
    """The sub-communicator's abort for its mapped error carries its own number of the rank (not the
    user's), and the user's abort reaches the other sub-communicator with the rank outside it as -(u+2),
    which its peers' waits map back to the user's rank: each crossing mapped once."""
    user, intra, inter = _rank5_of_3x2()
    step = named(inter, HpcclRemoteError("gone", rank=1), "all_reduce")
    inter.abort(origin(inter, step))
    assert inter.told == [1]  # inter rank 1 = user rank 3 (the old code sent 3 here, out of inter's range)
    call = named(user, step, "all_reduce")
    user.abort(origin(user, call))
    assert user.told == [3] and inter.told == [1] and intra.told == [-5]
    # rank 4, intra's rank 0 on the same node, hears -5 on its intra wire and names user rank 3
    heard = HpcclRemoteError.aborted("reduce_scatter", 11, -5, [1])
    assert named(intra, heard, "reduce_scatter").rank == 3


def test_a_step_hears_its_parents_abort_in_its_own_numbering():
    user, intra, inter = _rank5_of_3x2()
    user._transports[0].heard = 3  # the user's communicator's abort names user rank 3
    assert failures.peer_aborted(inter) == 1 and failures.peer_aborted(intra) == -5
    inter._transports[0].heard = 0  # its own wire first: inter rank 0 (user rank 1)
    assert failures.peer_aborted(inter) == 0


def test_a_death_seen_in_a_step_keeps_how_and_is_renumbered():
    user, intra, inter = _rank5_of_3x2()
    died = HpcclRemoteError.died("all_reduce", 6, 1, "UCX: connection to rank 1 failed (reset)", [1, 0])
    step = named(inter, died, "all_reduce")
    assert step.rank == 3 and step.awaited == [1, 3] and step.how == "UCX: connection to rank 3 failed (reset)"
    call = named(user, step, "all_reduce")
    assert "all_reduce #6: rank 3 died (UCX: connection to rank 3 failed (reset))" in str(call), str(call)
    assert "rank 1" not in str(call)


def test_a_step_timeout_names_user_ranks_and_is_not_passed_on_by_the_step():
    """A step's timeout names the ranks it waited for in the user's numbering; the step's Waiter does not
    abort (its parent asks its peers first and aborts naming who never came to the user's call)."""
    user, intra, inter = _rank5_of_3x2()
    t = named(inter, HpcclTimeoutError("all_reduce", 6, [1], 2.0), "all_reduce")
    assert t.missing == [3] and "rank(s) [3]" in str(t)
    call = named(user, t, "all_reduce")
    assert isinstance(call, HpcclTimeoutError) and call.missing == [3] and call.seq == 6
    assert origin(user, call) == 3 and origin(inter, t) == 1
    assert origin(user, HpcclTimeoutError("all_reduce", 6, [2, 3], 2.0)) is None  # several: none blamed

    failed = []
    w = Waiter(0.01, 0, [0, 1], lambda p: None, lambda: None, lambda origin=None: failed.append(origin))
    w.abort_on_timeout = False
    w.collective, w.seq = "all_reduce", 6
    with pytest.raises(HpcclTimeoutError):
        w.wait(lambda: False, [1])
    assert failed == []
    w.abort_on_timeout = True
    with pytest.raises(HpcclTimeoutError):
        w.wait(lambda: False, [1])
    assert failed == [1]


def test_errors_without_ranks_pass_unchanged():
    user, intra, inter = _rank5_of_3x2()
    e = HpcclSystemError("the communicator was aborted")
    assert named(inter, e, "all_reduce") is e and origin(inter, e) is None


# ----- the GPU path's pieces that run on the host (hpccl/gpu/netstep.py, EngineTransport, synchronize's watch) --
def _engine():
    """The engine's error codes (its module loads UCX first); the test is skipped where it is not built."""
    return pytest.importorskip("hpccl.transport.engine")._ne


def test_a_network_steps_timeout_names_user_ranks_after_its_call():
    """The engine's failure of a staged hier step ("all_reduce #6, step 2 (inter all_reduce): timed out ...
    waiting for rank(s) [1]": the inter sub-communicator's numbering, issue 32's GPU report) becomes a
    timeout naming the user's rank, after the user's call and the step."""
    ne = _engine()
    from hpccl.gpu.netstep import step_error
    user, intra, inter = _rank5_of_3x2()
    raw = step_error((ne.E_TIMEOUT, -1, "all_reduce #6, step 2 (inter all_reduce): timed out after 30.0s waiting "
                                        "for rank(s) [1] (HPCCL_TIMEOUT)"))
    assert isinstance(raw, HpcclTimeoutError) and raw.missing == [1]
    assert raw.in_call == ("all_reduce", 6, "step 2 (inter all_reduce)")
    late = failures.in_call(to_user(inter, raw))
    assert isinstance(late, HpcclTimeoutError) and late.missing == [3] and late.seq == 6
    assert "all_reduce #6 timed out after 30s waiting for rank(s) [3] (in its hierarchical step 2 (inter " \
           "all_reduce))" in str(late), str(late)
    # a flat call's step (every rank its own node): the user's numbering already, the call named
    flat = step_error((ne.E_TIMEOUT, -1, "broadcast #3: timed out after 5.0s waiting for rank(s) [0, 2] "
                                         "(HPCCL_TIMEOUT)"))
    assert isinstance(flat, HpcclTimeoutError) and flat.missing == [0, 2] and not hasattr(flat, "in_call")
    # a lost peer, as the transport names it
    gone = step_error((ne.E_PEER, 0, "all_reduce #6, step 2 (inter all_reduce): rank 0 is gone: UCX: ..."),
                      lambda peer, args: HpcclRemoteError("gone", rank=peer))
    assert to_user(inter, gone).rank == 1 and gone.in_call[2] == "step 2 (inter all_reduce)"


def test_an_engine_abort_names_the_rank_this_ranks_abort_passed_on():
    """A step failed by this rank's own abort of its sub-communicator (passing on user rank 3, outside it:
    -5 on its wire, which the engine does not keep) names rank 3, not "the communicator was aborted"."""
    ne = _engine()
    from hpccl.transport.engine import EngineTransport
    t = EngineTransport.__new__(EngineTransport)
    t.eng, t._closed, t.rank, t._origin = None, True, 1, None
    t._control_init()
    args = (ne.E_ABORT, -1, "the communicator was aborted")
    assert isinstance(t._failed(-1, args), HpcclSystemError)
    t._origin = -5
    e = t._failed(-1, args)
    assert isinstance(e, HpcclRemoteError) and e.rank == -5
    assert named(_rank5_of_3x2()[1], e, "all_gather").rank == 3


def test_a_step_sees_the_users_communicators_dead_and_aborted_peers():
    """A hier step's waits (and the network proxy's, through shared memory alone) see the node's other
    ranks die and the user's communicator's aborts, in the step's wire numbering."""
    user, intra, inter = _rank5_of_3x2()
    user._transports = [Wire("shm"), Wire("ucx")]
    assert failures.dead_peer(inter) is None and failures.local_dead_peer(intra) is None
    user._transports[0].dead = (4, "its process 123 on this node exited")
    assert failures.dead_peer(inter) == (-6, "its process 123 on this node exited")  # user rank 4, outside
    assert failures.local_dead_peer(intra) == (0, "its process 123 on this node exited")
    user._transports[0].dead = None
    user._transports[1].dead = (3, "UCX: connection to rank 3 failed")  # across the network
    assert failures.dead_peer(inter) == (1, "UCX: connection to rank 3 failed")
    assert failures.local_dead_peer(inter) is None  # the proxy thread reads shared memory only
    user._transports[0].heard = 3
    assert failures.local_peer_aborted(inter) == 1 and failures.local_peer_aborted(intra) == -5


def test_synchronize_watch_names_the_failure_in_the_users_numbering():
    """While a hier call's GPU network steps are pending, synchronize's watch sees a peer's abort or death
    (the user's communicator's or a step's), ranks in the user's numbering, and stops waiting at once."""
    import time
    user, intra, inter = _rank5_of_3x2()
    assert failures.watch(user) is None
    inter._transports[0].dead = (0, "UCX: connection to rank 0 failed (reset)")  # inter rank 0 = user rank 1
    e = failures.watch(user)
    assert isinstance(e, HpcclRemoteError) and e.rank == 1 and "rank 1 died (UCX: connection to rank 1" in str(e)
    assert origin(user, e) == 1
    intra._transports[0].heard = -5  # an abort on the intra wire naming user rank 3: reported first
    assert failures.watch(user).rank == 3
    t0 = time.monotonic()
    got = failures.await_steps(user, lambda: True, every=0.001)
    assert got.rank == 3 and time.monotonic() - t0 < 0.5
    polls = iter(range(5))
    assert failures.await_steps(user, lambda: next(polls, None) is not None, lambda: None) is None


def test_a_late_step_timeout_is_surveyed_at_the_users_call():
    """A network step's timeout raised by synchronize (issue 32's SIGSTOP at 2 nodes x 2 on GPU buffers):
    the step waited on its inter peer, which itself waits in its intra step on the stopped rank; surveyed at
    the user's communicator, the rank that never came is named (the waiter's answer), not the step's peer.
    A step of an earlier call than the user's latest is not surveyed (its answers would be another call's)."""
    user, intra, inter = _rank5_of_3x2()
    survey_type = type("Asks", (Transport,), {"survey": lambda self, peers, s: None, "isend": None,
                                             "irecv": None, "close": None, "abort": lambda self, o: None,
                                             "peer_aborted": lambda self: None})
    user._transports = [survey_type()]
    user._waiter.missing = lambda peers, surveyed=False: [2] if surveyed else list(peers)
    raw = HpcclTimeoutError("all_reduce", 6, [1], 2.0, "a GPU network step")
    raw.in_call = ("all_reduce", 6, "step 2 (inter all_reduce)")
    late = failures.in_call(to_user(inter, raw), user)
    assert isinstance(late, HpcclTimeoutError) and late.missing == [2], str(late)
    assert "waiting for rank(s) [2] (in its hierarchical step 2 (inter all_reduce))" in str(late)
    user._seq = 7  # the user has called again since: the step's own answer stands
    assert failures.in_call(to_user(inter, raw), user).missing == [3]


def test_a_step_ended_by_an_abort_from_outside_names_the_rank_the_user_communicator_heard():
    """A step's engine keeps only its own ranks as an abort's origin, so a step ended by an abort that passes
    on user rank 2 (outside inter [1, 3, 5]) fails without a rank; the user's communicator heard rank 2."""
    user, intra, inter = _rank5_of_3x2()
    bare = HpcclSystemError("all_reduce #6, step 2 (inter all_reduce): the communicator was aborted")
    bare.in_call = ("all_reduce", 6, "step 2 (inter all_reduce)")
    assert failures.in_call(bare, user) is bare  # nobody heard of a failure: as it was
    user._transports[0].heard = 2
    out = failures.in_call(bare, user)
    assert isinstance(out, HpcclRemoteError) and out.rank == 2, str(out)
    assert "rank 2 failed" in str(out) and "hierarchical step 2 (inter all_reduce)" in str(out)


def test_an_abort_without_its_origin_is_named_by_what_the_users_communicator_heard():
    """A call of the user's communicator ended by an abort its engine could not name (the origin lay outside
    the sub-communicator the abort came through: HpcclSystemError with .aborted): the user's communicator's
    control channel heard who failed, and the call names that rank, not "the communicator was aborted"; with
    nothing heard within a second it stays the system error."""
    user, _intra, _inter = _rank5_of_3x2()
    bare = HpcclSystemError("the communicator was aborted")
    bare.aborted = True
    user._transports[0].heard = 3
    out = named(user, bare, "broadcast")
    assert isinstance(out, HpcclRemoteError) and out.rank == 3 and "broadcast #6" in str(out), str(out)
    user._transports[0].heard = None
    assert named(user, bare, "broadcast") is bare
