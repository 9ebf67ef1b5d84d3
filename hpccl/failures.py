"""Failures of a communicator's calls: what its Waiter asks the transports (arrivals, aborts, dead peers,
a survey at a timeout), and how an error is named and passed on between a hier step's sub-communicator and
the user's communicator. Functions of the communicator (any object with the fields they read)."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from . import config
from .errors import HpcclError, HpcclInvalidUsage, HpcclRemoteError, HpcclTimeoutError
from .transport.base import Transport

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
    """(rank, why) of a peer whose process is gone, as a transport saw it; None if none is."""
    for t in comm._transports:
        d = t.dead_peer()
        if d is not None:
            return d
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
    """The rank a peer's abort names, or None; a hier step also listens to its parent's control channel
    (a rank outside the sub-communicator comes back as -(r+2), r in the parent's numbering)."""
    for t in comm._transports:
        r = t.peer_aborted()
        if r is not None:
            return r
    parent = comm._parent
    if parent is not None:  # a hier step: keep the user's communicator's control channel answered
        r = peer_aborted(parent)
        if r is not None:
            pr = comm.parent_ranks or []
            return pr.index(r) if r in pr else -(r + 2)  # -(r+2): a rank in the parent's numbering
    return None


# ----- naming an error -----------------------------------------------------------------------------------
def named(comm: Any, exc: HpcclError, coll: str) -> HpcclError:
    """The error a call raises: a transport's report of a lost peer gets the call's name; a hier
    step's (sub-communicator's) error goes up in its parent's rank numbering; the user's communicator
    names its own call, and the step it failed in."""
    seq = comm._seq
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None and not exc.collective:
        exc = HpcclRemoteError(f"{coll} #{seq}: {exc.message}", exc.rank, coll, seq, exc.awaited)
    if comm.parent_ranks is not None:
        return in_parent(comm.parent_ranks, exc)
    if type(exc) is HpcclInvalidUsage and not exc.message.startswith(f"{coll} #"):
        # met while the call ran (a peer's message of another size): the call is named, as the compiled
        # path names it
        exc = HpcclInvalidUsage(f"{coll} #{seq}: {exc.message}")
    return as_call(comm, exc, coll)


def as_call(comm: Any, exc: HpcclError, coll: str) -> HpcclError:
    """An error met in a step of hier (a sub-communicator's call) names the user's call and its sequence
    number, and the step by its place in the call (the sub-communicators' own counts stay internal)."""
    step = getattr(exc, "collective", "")
    if not step or ((step, exc.seq) == (coll, comm._seq) and not getattr(exc, "from_step", False)):
        return exc
    where = f"in its hierarchical {comm._rec.step() or 'step ' + step}"
    if isinstance(exc, HpcclTimeoutError):
        # who never arrived at the user's call, not at the step: ask at this communicator's level
        missing = exc.missing
        if survey(comm):
            missing = comm._waiter.missing(exc.missing, surveyed=True)
        return HpcclTimeoutError(coll, comm._seq, missing, config.get("HPCCL_TIMEOUT"), where)
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None:
        return HpcclRemoteError.aborted(coll, comm._seq, exc.rank, exc.awaited, f"; {where}")
    return exc


def in_parent(parent_ranks: Optional[Sequence[int]], exc: HpcclError) -> HpcclError:
    """A sub-communicator's timeout or remote failure names its parent's ranks, the ones the user knows
    (once: a network step's error, mapped on the proxy thread, passes here again on the caller's)."""
    if getattr(exc, "from_step", False):
        return exc
    pr = parent_ranks
    if pr is not None and isinstance(exc, HpcclRemoteError) and exc.rank is not None and exc.collective:
        out = HpcclRemoteError.aborted(exc.collective, exc.seq, -exc.rank - 2 if exc.rank < 0 else pr[exc.rank],
                                       [pr[m] for m in exc.awaited if 0 <= m < len(pr)])
        out.from_step = True
        return out
    if pr is None or not isinstance(exc, HpcclTimeoutError):
        return exc
    out = HpcclTimeoutError(exc.collective, exc.seq, [pr[m] for m in exc.missing if 0 <= m < len(pr)],
                            config.get("HPCCL_TIMEOUT"), "ranks of the whole communicator; a step of its "
                            "hierarchical algorithm")
    out.from_step = True  # the parent names its own call and asks who never arrived at it
    return out


def in_call(exc: HpcclError) -> HpcclError:
    """A hier network step's error raised after its call returned (by synchronize, from a held stream's
    step): named after the user's call and the step, as recorded when the step was enqueued, like the
    error of a step that fails inside its call (as_call, which also surveys the peers)."""
    at = getattr(exc, "in_call", None)
    if at is None:
        return exc
    coll, seq, step = at
    where = f"in its hierarchical {step}"
    if isinstance(exc, HpcclTimeoutError):
        return HpcclTimeoutError(coll, seq, exc.missing, config.get("HPCCL_TIMEOUT"), where)
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None:
        return HpcclRemoteError.aborted(coll, seq, exc.rank, exc.awaited, f"; {where}")
    return exc


# ----- passing a failure on ------------------------------------------------------------------------------
def abort(comm: Any, origin: Optional[int] = None) -> None:
    """Mark comm failed and tell every peer through its transports, and hier's sub-communicators (an origin
    outside one travels in comm's numbering, as -(r+2)); ``origin``: the rank whose failure this passes on."""
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
            pr = sub.parent_ranks or []
            # an origin outside the sub-communicator travels in this communicator's numbering, as -(r+2)
            sub.abort(None if origin is None else pr.index(origin) if origin in pr else -(origin + 2))
