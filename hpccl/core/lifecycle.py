"""Making and ending communicators: split and shrink (new communicators over a new bootstrap), hier's
'intra' and 'inter' sub-communicators, and destroy. Functions of the communicator; a new communicator is of
the same class as the one it comes from, so this module imports none."""
from __future__ import annotations

import contextvars
from typing import Any, Optional, Sequence

from ..errors import HpcclInvalidArgument, HpcclInvalidUsage

# (parent's recorder, 'intra'/'inter') while subcomm builds a sub-communicator whose calls are steps of the
# parent's calls: it records them there (recorder.StepRecorder), never as calls of its own
STEPS_OF: contextvars.ContextVar = contextvars.ContextVar("hpccl_steps_of", default=None)


def split(comm: Any, color: int, key: int, node_id: Optional[str]) -> Optional[Any]:
    """A new communicator of comm's ranks of this color, ordered by key; None for color < 0."""
    sub = comm._boot.split(color, key)
    if sub is None or (comm._boot.comm is not None and sub == _mpi_null()):
        return None
    try:
        return type(comm)(sub, node_id=node_id)
    finally:
        comm._boot.release(sub)


def shrink(comm: Any, exclude: Sequence[int]) -> Any:
    """A new communicator of every rank not in ``exclude``, with no collective over them (see
    Communicator.shrink)."""
    if comm._destroyed:
        raise HpcclInvalidUsage("shrink called on a destroyed communicator")
    try:
        ex = sorted({int(r) for r in exclude})
    except (TypeError, ValueError):
        raise HpcclInvalidArgument("exclude", f"{exclude!r} is not a list of ranks") from None
    for r in ex:
        comm._rank_arg(r, "exclude")
    if comm.rank in ex:
        raise HpcclInvalidArgument("exclude", f"names this rank ({comm.rank}); an excluded rank does not call shrink")
    sub = comm._boot.shrink(ex)
    try:
        return type(comm)(sub, node_id=comm._node_override)
    finally:
        comm._boot.release(sub)


def subcomm(comm: Any, kind: str) -> Any:
    """'intra': the ranks of this node; 'inter': one rank per node with the same local rank. Made at its
    first use (collective), its calls recorded as steps of comm's; on comm's GPU once comm has one."""
    if kind not in comm._sub:
        color = comm.node if kind == "intra" else comm.local_rank
        token = STEPS_OF.set((comm._rec, kind))  # its calls are steps of this communicator's calls
        try:
            c = split(comm, color, comm.rank, f"{kind}{comm.node}" if kind == "intra" else None)
        finally:
            STEPS_OF.reset(token)
        c.parent_ranks = (comm.nodes.ranks_on(comm.node) if kind == "intra" else
                          [r for r in range(comm.size) if comm.nodes.local_rank(r) == comm.local_rank])
        c._parent = comm
        c._waiter.abort_on_timeout = False  # the parent names who never came to the user's call, and aborts
        comm._sub[kind] = c
    sub = comm._sub[kind]
    if comm._dev is not None and sub.cuda_device is None:
        sub.cuda_device = comm._dev.device  # 'inter' has local rank 0 everywhere: never guess from it
        # every rank of this communicator on one GPU, not just the sub-communicator's, shares it:
        # the node kernels are sized from that (hpccl/gpu/cuda_comm.py, block_cap); collective here
        sub.gpu_share = comm._dev.gpu_share(comm._boot)
    return sub


def destroy(comm: Any) -> None:
    """Release the hot path, GPU side, sub-communicators, transports and bootstrap; safe to call twice."""
    if comm._destroyed:
        return
    comm._planner.close()
    comm._arena.close()
    if comm._hot is not None:
        comm._hot.cancel()
        comm._hot = None
    if comm._gpu_timer is not None:
        try:
            comm._gpu_timer.harvest(comm._rec.trace, wait=True)
            comm._gpu_timer.close()
        except Exception:  # noqa: BLE001 - a failed GPU leaves its calls untimed
            pass
        comm._gpu_timer = None
    if comm._rec.trace is not None:
        comm._rec.trace.close()
    if comm._dev is not None:
        comm._dev.close()
        comm._dev = None
    for sub in comm._sub.values():
        sub.destroy()
    comm._sub = {}
    comm._prim.window_views.clear()  # numpy views pin the mappings; drop them first
    comm._prim._scratch.clear()
    for t in comm._transports:
        t.close()
    comm._table.clear()
    comm._boot.close()
    comm._destroyed = True


def _mpi_null() -> Any:
    from mpi4py import MPI
    return MPI.COMM_NULL
