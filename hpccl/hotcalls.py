"""A communicator's calls on the compiled hot path (hpccl/hotpath.py): which collectives it serves now,
the validated host calls it runs, and the end of a call its front door took (the wait, a failure).
Functions of the communicator (the fields they read); Communicator._front_door calls them."""
from __future__ import annotations

from typing import Any, NoReturn

from . import hotpath
from .errors import HpcclError, HpcclRemoteError, HpcclSystemError
from .failures import named
from .hotpath import OPCODE
from .interop import HOST


def attach(comm: Any, shm: Any, net: Any, spin: int) -> None:
    """The compiled hot path of this layout, if it has one: over the node's shared-memory segments (one node),
    or over the network engine (every rank its own node); its calls are counted in C for comm.stats()."""
    if shm is not None and comm.num_nodes == 1:
        comm._hot = hotpath.attach(shm, comm.rank, spin, comm._prim.single_copy)
    elif net is not None and comm.local_size == 1 and comm.num_nodes == comm.size:
        comm._hot = hotpath.attach_net(net, spin)
    if comm._hot is not None:
        comm._hot_serves = hotpath.collectives(comm._hot)
        hot, size = comm._hot, comm.size  # its calls are counted in C, front door and validated path alike
        comm._rec.stats.external.append(
            lambda: [(c, HOST, "hot", n, b, t) for c, n, b, t in hotpath.counts(hot, size)])
        refresh(comm)


def refresh(comm: Any) -> None:
    """Which collectives the hot path serves: all it can, but not one HPCCL_ALGO (or a benchmark's
    force) pins to another algorithm; the front door also steps aside for HPCCL_CHECK and the flight
    recorder's dumps, which need every call to pass through Python."""
    if comm._hot is None or comm._aborted or comm._destroyed:
        return
    ov = comm._tuner.override
    comm._hot_colls = frozenset(c for c in comm._hot_serves if (ov.get(c) or ov.get("*")) in (None, "hot"))
    comm._front = ({} if comm._check_calls or comm._rec.dump_dir or comm._rec.trace is not None
                   else {c: comm._hot for c in comm._hot_colls})


def done(comm: Any, rc: int, coll: str) -> None:
    """A call the hot path took from the front door: count it, and finish its wait if it is pending
    (the Waiter's timeout, abort and dead-peer checks; a failure is named and aborts as in _run)."""
    comm._seq += 1
    if rc == 0:
        return
    comm._waiter.collective, comm._waiter.seq = coll, comm._seq
    try:
        comm._waiter.wait(comm._hot.resume, comm._hot.waiting)
    except HpcclError as exc:
        failed(comm, exc, coll)
    except OSError as exc:  # a direct call's read of a peer's memory failed (the message names the peer)
        failed(comm, HpcclSystemError(str(exc)), coll)


def failed(comm: Any, exc: HpcclError, coll: str) -> NoReturn:
    """A front-door call failed: drop it, name it and abort, as _run does for the validated path."""
    comm._hot.cancel()
    exc = named(comm, exc, coll)
    comm.abort(exc.rank if isinstance(exc, HpcclRemoteError) else None)
    raise exc from None


def run(comm: Any, call: Any) -> bool:
    """Run a validated host call on the hot path; False when it declines (a dtype or size it does not
    take: the same on every rank, so every rank runs the Python algorithm instead)."""
    hot, coll, a, seq = comm._hot, call.coll, call.args, comm._seq
    try:  # the path across nodes can fail in its first round, before it returns
        if coll == "all_reduce" or coll == "reduce_scatter":
            recv = None if a[1] is a[0] else a[1]
            rc = getattr(hot, coll)(a[0], recv, OPCODE[a[2]], seq)
        elif coll == "all_gather":
            rc = hot.all_gather(a[0], a[1], seq)
        elif coll == "broadcast":
            rc = hot.broadcast(a[0], None if a[1] is a[0] else a[1], a[2], seq)
        elif coll == "reduce":
            rc = hot.reduce(a[0], None if a[1] is a[0] else a[1], a[2], OPCODE[a[3]], seq)
        elif coll == "all_to_all":
            rc = hot.all_to_all(a[0], None if a[1] is a[0] else a[1], seq)
        else:
            rc = hot.barrier(seq)
        if rc < 0:
            return False
        comm._rec.algo("hot")
        if rc:
            comm._waiter.wait(hot.resume, hot.waiting)
    except HpcclError:  # (HpcclTimeoutError is an OSError too: it passes as it is)
        hot.cancel()
        raise
    except OSError as exc:  # a direct call's read of a peer's memory failed (the message names the peer)
        hot.cancel()
        raise HpcclSystemError(str(exc)) from None
    except BaseException:
        hot.cancel()
        raise
    return True
