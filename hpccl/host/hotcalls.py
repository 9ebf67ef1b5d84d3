"""A communicator's calls on the compiled hot path (hpccl/host/hotpath.py): its attachment (the planner
decides which collectives it serves), the calls its front door takes before Python validation, and the
validated host calls the planner routes to it. Errors are hpccl's in one place (``error``), named and
aborting as the validated path's do. Functions of the communicator (the fields they read)."""
from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from . import hotpath
from .. import config
from ..errors import HpcclError, HpcclSystemError
from ..memory.interop import HOST
from ..ops import ReduceOp
from ..runtime.failures import count, named, origin
from .hotpath import OPCODE

#: the collectives a C front door can take (barrier has no buffers: its method calls the hot path itself)
DOOR_COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")
#: the ops in the hot paths' code order (OPCODE's), which the door compares by identity first
OPS = tuple(sorted(ReduceOp, key=OPCODE.__getitem__))


def attach(comm: Any, shm: Any, net: Any, spin: int) -> None:
    """The compiled hot path of this layout, if it has one: over the node's shared-memory segments (one node),
    or over the network engine (every rank its own node); its calls are counted in C for comm.stats()."""
    if shm is not None and comm.num_nodes == 1:
        comm._hot = hotpath.attach(shm, comm.rank, spin, comm._prim.single_copy)
    elif net is not None and comm.local_size == 1 and comm.num_nodes == comm.size:
        comm._hot = hotpath.attach_net(net, spin)
    if comm._hot is not None:
        hot, size, stats = comm._hot, comm.size, comm._rec.stats  # its calls are counted in C, by entry
        hot.latency = int(stats.latency)
        stats.attach(lambda: [(c, HOST, "hot", n, b, t) for c, n, b, t in hotpath.counts(hot, size)],
                     lambda: hotpath.detail(hot, size, stats.latency), lambda: hot.busy)
        # the front door steps aside for HPCCL_CHECK and the flight recorder's dumps and trace, which need
        # every call to pass through Python; the planner leaves out what HPCCL_ALGO pins elsewhere
        comm._planner.attach_hot(hot, hotpath.collectives(hot), not (
            comm._check_calls or comm._rec.dump_dir or comm._rec.trace is not None))
        doors(comm, hotpath.collectives(hot))


def doors(comm: Any, colls: tuple) -> None:
    """Each collective the hot path serves gets a C front door (hpccl/csrc/_frontdoor.c) as an attribute of
    the communicator, shadowing the method: the same front door without the Python (HPCCL_HOST_DOOR)."""
    door = hotpath.front_door_type()
    if door is None or not config.get("HPCCL_HOST_DOOR"):
        return
    for coll in colls:
        if coll in DOOR_COLLECTIVES:
            comm.__dict__[coll] = door(comm, coll, getattr(type(comm), coll), comm._front, comm.rank, np.ndarray,
                                       OPS, OPCODE, ReduceOp, (HpcclError, OSError), door_failed, wait)


def door_failed(comm: Any, exc: BaseException, coll: str) -> NoReturn:
    """A C front door's call failed across nodes (comm._seq already counts it): named and aborting."""
    failed(comm, error(exc), coll)


def error(exc: BaseException) -> HpcclError:
    """The hpccl error of a hot-path failure: an HpcclError as it is (HpcclTimeoutError is an OSError
    too), any other OSError (a direct call's read of a peer's memory; the message names the peer) as
    HpcclSystemError."""
    return exc if isinstance(exc, HpcclError) else HpcclSystemError(str(exc))


def door_raised(comm: Any, exc: BaseException, coll: str) -> NoReturn:
    """A Python front door's C call that raised before returning (the path across nodes: a round failed):
    it takes its number, then fails as a C front door's does (door_failed)."""
    comm._seq += 1
    door_failed(comm, exc, coll)


def door_done(comm: Any, hot: Any, coll: str, rc: int) -> bool:
    """What a front door's C call returned: declined (rc < 0, nothing changed: False), or taken with its
    number, finished now or (rc > 0, pending) through wait()."""
    if rc < 0:
        return False
    comm._seq += 1
    if rc:
        wait(comm, hot, coll)
    return True


def wait(comm: Any, hot: Any, coll: str) -> None:
    """Finish a call the front door left pending (Communicator._front_door makes the C call inline, the
    common case's whole cost): the Waiter's timeout, abort and dead-peer checks; a failure named and
    aborting as the validated path's."""
    comm._waiter.collective, comm._waiter.seq = coll, comm._seq
    try:
        comm._waiter.wait(hot.resume, hot.waiting)
    except (HpcclError, OSError) as exc:
        failed(comm, error(exc), coll)


def failed(comm: Any, exc: HpcclError, coll: str) -> NoReturn:
    """A front-door call failed: drop it, name it and abort, as _run does for the validated path."""
    comm._hot.cancel()
    exc = named(comm, exc, coll)
    count(comm, exc)
    comm.abort(origin(comm, exc))
    raise exc from None


def run(comm: Any, call: Any) -> bool:
    """Run a validated host call on the hot path; False when it declines (a dtype or size it does not
    take: the same on every rank, so every rank runs the Python algorithm instead)."""
    hot, coll, a, seq = comm._hot, call.coll, call.args, comm._seq
    hot.validated = 1  # counted apart from the front door's calls (metrics' path "python")
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
    except (HpcclError, OSError) as exc:  # named and aborting in Communicator._run
        hot.cancel()
        raise error(exc) from None
    except BaseException:
        hot.cancel()
        raise
    finally:
        hot.validated = 0  # a call declined before it started leaves it set
    return True
