"""Failures of a communicator's calls: what its Waiter asks the transports (arrivals, aborts, dead peers,
a survey at a timeout), and how an error is named and passed on between a hier step's sub-communicator and
the user's communicator. Functions of the communicator (any object with the fields they read)."""
from __future__ import annotations

import itertools
import re
import time
from typing import Any, Callable, Optional, Sequence, Tuple

from .. import config
from ..errors import HpcclError, HpcclInvalidUsage, HpcclRemoteError, HpcclSystemError, HpcclTimeoutError
from ..transport.base import Transport

SURVEY_S = 0.5  # how long a timed-out rank waits for its peers' answers to "which collective are you in?"


# ----- what the Waiter asks the transports ---------------------------------------------------------------
def arrived(comm: Any, peer: int) -> Optional[int]:
    """The last call ``peer`` announced, from the first transport that can see it (None: none can)."""
    for t in comm._transports:
        s = t.arrived(peer)
        if s is not None:
            return s
    return None


def dead_peer(comm: Any) -> Optional[Tuple[int, str]]:
    """(rank, why) of a peer whose process is gone, as a transport saw it, in comm's wire numbering; None if
    none is. A hier step also looks at the user's communicator's peers (its node's other ranks, the ranks its
    network connections reach): a rank that dies outside the step fails the user's call all the same."""
    for t in comm._transports:
        d = t.dead_peer()
        if d is not None:
            return d
    parent = comm._parent
    if parent is not None:
        d = dead_peer(parent)
        if d is not None:
            return wire_rank(comm.parent_ranks, d[0]), d[1]
    return None


def _local(comm: Any) -> list:
    return [t for t in comm._transports if getattr(t, "name", "") == "shm"]


def _ask_local(comm: Any, ask: Callable[[Any], Any], rank_of: Callable[[Any, Callable[[int], int]], Any]) -> Any:
    """``ask`` of comm's shared-memory transports, then of its parent's for a hier step (the answer's rank
    put in comm's wire numbering by ``rank_of(answer, to_wire)``); None when none answers."""
    for t in _local(comm):
        a = ask(t)
        if a is not None:
            return a
    parent = comm._parent
    if parent is not None:
        a = _ask_local(parent, ask, rank_of)
        if a is not None:
            return rank_of(a, lambda r: wire_rank(comm.parent_ranks, r))
    return None


def local_dead_peer(comm: Any) -> Optional[Tuple[int, str]]:
    """dead_peer() through shared memory alone (the node's processes, of comm and of the user's communicator
    for a hier step): safe off the caller's thread (the network proxy's waits), as it polls no channel."""
    return _ask_local(comm, lambda t: t.dead_peer(), lambda d, wire: (wire(d[0]), d[1]))


def local_peer_aborted(comm: Any) -> Optional[int]:
    """peer_aborted() through shared memory alone (the abort flags of the node's ranks, comm's and the user's
    communicator's for a hier step), in comm's wire numbering: safe off the caller's thread."""
    return _ask_local(comm, lambda t: t.peer_aborted(), lambda r, wire: wire(r))


def first_within(wait: float, look: Callable[[], Any]) -> Any:
    """look()'s first answer that is not None, looking every millisecond for up to ``wait`` seconds (at
    least once); None when there was none: a word a peer's abort sends may arrive a moment after its effect."""
    end = time.monotonic() + wait
    while (got := look()) is None and time.monotonic() < end:
        time.sleep(1e-3)
    return got


def await_steps(comm: Any, pending: Callable[[], bool], check: Optional[Callable[[], Optional[HpcclError]]] = None,
                every: float = 0.02) -> Optional[HpcclError]:
    """Wait while ``pending()`` (GPU network steps handed to an engine not ended), looking every ``every``
    seconds at what ``check`` (default: watch(comm)) sees; the first failure found, or None once nothing is
    pending (a step that never ends is ended by the engine at HPCCL_TIMEOUT)."""
    check = check or (lambda: watch(comm))
    nap, next_check = 5e-5, 0.0
    while pending():
        now = time.monotonic()
        if now >= next_check:
            exc = check()
            if exc is not None:
                return exc
            next_check = now + every
        time.sleep(nap)
        nap = min(nap * 2, 2e-4)  # as the Waiter's naps: synchronize returns soon after the steps end
    return None


def watch(comm: Any) -> Optional[HpcclError]:
    """What comm's host sees while its GPU work waits (synchronize, with a hier call's network steps still
    pending): a peer's abort, or a peer whose process (on this node) or connection (to another node) is
    gone, in comm or one of its sub-communicators, as the error to raise, its ranks in the user's numbering;
    None while all is well. On the caller's thread (it polls the control channels)."""
    coll, seq = comm._waiter.collective, comm._seq
    note = "; seen while synchronize waited for the call's GPU work"
    for c in (comm, *comm._sub.values()):
        r = peer_aborted(c)
        if r is not None:
            return to_user(c, HpcclRemoteError.aborted(coll, seq, r, [], note))
    for c in (comm, *comm._sub.values()):
        d = dead_peer(c)
        if d is not None:
            return to_user(c, HpcclRemoteError.died(coll, seq, d[0], d[1], [], note))
    return None


def survey(comm: Any) -> bool:
    """At a timeout: transports that cannot see their peers' arrival ask them (MPI's control channel).
    A hier step's sub-communicator does not: its parent asks at the level of the user's call, at the
    same moment as the other ranks (which answer only while they are still waiting or asking)."""
    if comm._parent is not None:
        return False
    asked = False
    for t in comm._transports:
        if type(t).survey is not Transport.survey:
            t.survey(comm._waiter.ranks, SURVEY_S)
            asked = True
    return asked


def peer_aborted(comm: Any) -> Optional[int]:
    """The rank a peer's abort names, in comm's wire numbering, or None; a hier step also listens to its
    parent's control channel and shared memory (the parent's ranks come back as wire_rank gives them)."""
    for t in comm._transports:
        r = t.peer_aborted()
        if r is not None:
            return r
    parent = comm._parent
    if parent is not None:  # a hier step: keep the user's communicator's control channel answered
        r = peer_aborted(parent)
        if r is not None:
            return wire_rank(comm.parent_ranks, r)
    return None


# ----- rank numbering ------------------------------------------------------------------------------------
# Two numberings of ranks meet in a hier layout, and every rank number a failure carries is in exactly one:
#   * a communicator's wire numbering: what its transports, its Waiter and its GPU engine report, and what
#     its aborts carry. r >= 0 is the communicator's own rank r; r <= -2 stands for rank -(r+2) of the
#     user's communicator outside it (a hier sub-communicator hears those in its parent's aborts). The wire
#     numbering of a communicator the user made is the user's numbering.
#   * the user's numbering: the ranks of the communicator the user called (a hier sub-communicator's parent).
# An error whose ranks are in the user's numbering carries that communicator's numbering token
# (``exc.numbering``); an error without one is in the wire numbering of the communicator whose call (or
# synchronize) it is leaving. to_user() is the one conversion, made where an error leaves a communicator's
# call, and it leaves an error that carries the token as it is: no rank is mapped twice, whichever way and
# however often an error passes. origin() is the one way back, for the rank an abort carries.
_TOKENS = itertools.count(1)


def new_numbering() -> int:
    """A token for a communicator's numbering (Communicator._numbering)."""
    return next(_TOKENS)


def user_rank(parent_ranks: Optional[Sequence[int]], r: Optional[int]) -> Optional[int]:
    """Rank ``r`` of a communicator's wire numbering in the user's numbering; ``parent_ranks``: the
    communicator's ranks in its parent (a hier sub-communicator), None for one the user made. None when r
    is no rank (None, -1, out of range)."""
    if r is None or r == -1:
        return None
    if r <= -2:
        return -r - 2 if parent_ranks is not None else None
    if parent_ranks is None:
        return r
    return parent_ranks[r] if r < len(parent_ranks) else None


def wire_rank(parent_ranks: Optional[Sequence[int]], u: int) -> int:
    """Rank ``u`` of the user's numbering in a communicator's wire numbering (user_rank's inverse)."""
    if parent_ranks is None:
        return u
    return parent_ranks.index(u) if u in parent_ranks else -(u + 2)


def user_numbering(comm: Any) -> int:
    """The token of the numbering comm's failures are reported in: its parent's for a hier step."""
    return (comm._parent if comm._parent is not None else comm)._numbering


def to_user(comm: Any, exc: HpcclError) -> HpcclError:
    """``exc``, raised by comm's call, with its ranks in the user's numbering (once: an error that carries
    the user's numbering token passes as it is). A hier step's error is marked ``from_step``: its parent
    names its own call (as_call)."""
    token = user_numbering(comm)
    if getattr(exc, "numbering", None) == token:
        return exc
    pr = comm.parent_ranks
    if pr is not None:
        exc = renumbered(exc, lambda r: user_rank(pr, r))
        exc.from_step = True
    exc.numbering = token
    return exc


def renumbered(exc: HpcclError, f: Callable[[Optional[int]], Optional[int]]) -> HpcclError:
    """A new error like ``exc`` with every rank it carries (rank, awaited, missing) passed through f and its
    message written again from them; errors that carry no ranks come back as they are."""
    if isinstance(exc, HpcclRemoteError):
        rank = f(exc.rank)
        awaited = sorted({a for a in map(f, exc.awaited) if a is not None})
        call = f"{exc.collective} #{exc.seq}: " if exc.collective else ""
        if rank is None:
            out = HpcclRemoteError(f"{call}a peer failed and the communicator was aborted (this rank was waiting "
                                   f"on rank(s) {awaited})", None, exc.collective, exc.seq, awaited)
        elif exc.how:
            out = HpcclRemoteError.died(exc.collective, exc.seq, rank, _renumber_text(exc.how, f), awaited)
            if not call:
                out = _reworded(out, f"rank {rank} died ({out.how})")
        elif call:
            out = HpcclRemoteError.aborted(exc.collective, exc.seq, rank, awaited)
        else:
            out = HpcclRemoteError(f"rank {rank} failed and the communicator was aborted", rank, "", 0, awaited)
    elif isinstance(exc, HpcclTimeoutError):
        out = HpcclTimeoutError(exc.collective, exc.seq, [m for m in map(f, exc.missing) if m is not None],
                                exc.timeout, "ranks of the whole communicator; a step of its hierarchical "
                                "algorithm")
    else:
        return exc
    if hasattr(exc, "in_call"):
        out.in_call = exc.in_call
    return out


def _reworded(exc: HpcclRemoteError, message: str) -> HpcclRemoteError:
    out = HpcclRemoteError(message, exc.rank, exc.collective, exc.seq, exc.awaited)
    out.how = exc.how
    return out


def _renumber_text(text: str, f: Callable[[Optional[int]], Optional[int]]) -> str:
    """'rank N' in a transport's description of a death (UCX: connection to rank N failed) renumbered."""
    def one(m: "re.Match[str]") -> str:
        u = f(int(m.group(1)))
        return m.group(0) if u is None else f"rank {u}"
    return re.sub(r"\brank (\d+)", one, text)


def culprit(exc: HpcclError) -> Optional[int]:
    """The rank at fault in ``exc``, in exc's numbering: the rank a remote error names, the only rank a
    timeout waited for; None when it names none (this rank's own failure, or several missing ranks)."""
    if isinstance(exc, HpcclRemoteError):
        return exc.rank
    if isinstance(exc, HpcclTimeoutError) and len(exc.missing) == 1:
        return exc.missing[0]
    return None


def origin(comm: Any, exc: Optional[BaseException]) -> Optional[int]:
    """The rank comm's abort for ``exc`` carries, in comm's wire numbering (None: this rank)."""
    if not isinstance(exc, HpcclError):
        return None
    r = culprit(exc)
    if r is None:
        return None
    if getattr(exc, "numbering", None) == user_numbering(comm):
        return wire_rank(comm.parent_ranks, r)
    return r


# ----- naming an error -----------------------------------------------------------------------------------
def named(comm: Any, exc: HpcclError, coll: str) -> HpcclError:
    """The error a call raises: a transport's report of a lost peer gets the call's name; its ranks go to
    the user's numbering (to_user: a hier step's error leaves its sub-communicator so); the user's
    communicator names its own call, and the step it failed in."""
    return _named(comm, exc, coll)


def count(comm: Any, exc: HpcclError) -> None:
    """A failed call of the user's communicator in its statistics: errors by kind and the peer lost (metrics)."""
    if comm._parent is None:
        comm._rec.stats.error(exc, exc.rank if isinstance(exc, HpcclRemoteError) else None)


def _named(comm: Any, exc: HpcclError, coll: str) -> HpcclError:
    seq = comm._seq
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None and not exc.collective:
        out = HpcclRemoteError(f"{coll} #{seq}: {exc.message}", exc.rank, coll, seq, exc.awaited)
        out.how = exc.how
        if hasattr(exc, "numbering"):
            out.numbering = exc.numbering
        exc = out
    exc = to_user(comm, exc)
    if comm._parent is not None:
        return exc
    if isinstance(exc, HpcclSystemError) and getattr(exc, "aborted", False):
        # ended by an abort whose origin lies outside the sub-communicator whose engine saw it (a hier step's
        # engine keeps only its own ranks): this communicator's control channel hears who failed
        r = first_within(1.0, lambda: peer_aborted(comm))
        if r is not None and r != comm.rank:
            return to_user(comm, HpcclRemoteError.aborted(coll, seq, r, [], ""))
    if type(exc) is HpcclInvalidUsage and not exc.message.startswith(f"{coll} #"):
        # met while the call ran (a peer's message of another size): the call is named, as the compiled
        # path names it
        exc = HpcclInvalidUsage(f"{coll} #{seq}: {exc.message}")
        exc.numbering = user_numbering(comm)
    return as_call(comm, exc, coll)


def as_call(comm: Any, exc: HpcclError, coll: str) -> HpcclError:
    """An error met in a step of hier (a sub-communicator's call, its ranks already the user's) names the
    user's call and its sequence number, and the step by its place in the call (the sub-communicators' own
    counts stay internal)."""
    step = getattr(exc, "collective", "")
    if not step or ((step, exc.seq) == (coll, comm._seq) and not getattr(exc, "from_step", False)):
        return exc
    where = f"in its hierarchical {comm._rec.step() or 'step ' + step}"
    if isinstance(exc, HpcclTimeoutError):
        # who never arrived at the user's call, not at the step: ask at this communicator's level
        missing = exc.missing
        if survey(comm):
            missing = comm._waiter.missing(exc.missing, surveyed=True)
        return _same_numbering(exc, HpcclTimeoutError(coll, comm._seq, missing, _timeout(exc), where))
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None:
        return _same_numbering(exc, _in_user_call(exc, coll, comm._seq, where))
    return exc


def _in_user_call(exc: HpcclRemoteError, coll: str, seq: int, where: str) -> HpcclRemoteError:
    if exc.how:
        return HpcclRemoteError.died(coll, seq, exc.rank, exc.how, exc.awaited, f"; {where}")
    return HpcclRemoteError.aborted(coll, seq, exc.rank, exc.awaited, f"; {where}")


def _timeout(exc: HpcclTimeoutError) -> float:
    """The timeout a step's wait ran under (HPCCL_TIMEOUT, or the engine's for a network step)."""
    t = getattr(exc, "timeout", None)
    return config.get("HPCCL_TIMEOUT") if t is None else t


def _same_numbering(exc: HpcclError, out: HpcclError) -> HpcclError:
    if hasattr(exc, "numbering"):
        out.numbering = exc.numbering
    return out


def in_call(exc: HpcclError, comm: Any = None) -> HpcclError:
    """A hier network step's error raised after its call returned (by synchronize, from a held stream's
    step; its ranks already the user's): named after the user's call and the step, as recorded when the
    step was enqueued, like the error of a step that fails inside its call (as_call). A timeout of the
    user's latest call is surveyed at comm's level as as_call does: the step's peer may itself be waiting in
    another step, on the rank that never came."""
    at = getattr(exc, "in_call", None)
    if at is None:
        return exc
    coll, seq, step = at
    where = f"in its hierarchical {step}"
    if isinstance(exc, HpcclTimeoutError):
        missing = exc.missing
        if comm is not None and seq == comm._seq and survey(comm):
            missing = comm._waiter.missing(exc.missing, surveyed=True)
        return _same_numbering(exc, HpcclTimeoutError(coll, seq, missing, _timeout(exc), where))
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None:
        return _same_numbering(exc, _in_user_call(exc, coll, seq, where))
    r = None
    if comm is not None:
        # a step ended by an abort: the peer that aborted tells the user's communicator's control channel
        # who failed, which may arrive a moment after its abort reached this step's engine
        r = first_within(1.0 if getattr(exc, "aborted", False) else 0.0, lambda: peer_aborted(comm))
    if r is not None and r != comm.rank:
        # the step was ended by an abort whose origin lies outside its sub-communicator (its engine keeps
        # only its own ranks): the user's communicator heard who failed
        return to_user(comm, HpcclRemoteError.aborted(coll, seq, r, [], f"; {where}"))
    return exc


# ----- passing a failure on ------------------------------------------------------------------------------
def abort(comm: Any, origin: Optional[int] = None) -> None:
    """Mark comm failed and tell every peer through its transports, and hier's sub-communicators;
    ``origin``: the rank whose failure this passes on, in comm's wire numbering (origin() gives it for an
    error), None for this rank."""
    if not comm._aborted:
        comm._aborted = True
        comm._planner.close()  # the hot path's front door and the plans go
        comm._rec.dump(f"abort in {comm._waiter.collective} #{comm._seq}"
                       + ("" if origin is None or origin == comm.rank else f", passed on from rank {origin}"))
        if comm._dev is not None and comm._dev.engine is not None:
            comm._dev.engine.fs.live = 0  # no more replays of launch snapshots
        for t in comm._transports:
            t.abort(comm.rank if origin is None else origin)
        for sub in comm._sub.values():  # hier's steps wait on the sub-communicators' transports
            # in the sub-communicator's wire numbering: an origin outside it travels as -(r+2)
            sub.abort(None if origin is None else wire_rank(sub.parent_ranks, origin))
