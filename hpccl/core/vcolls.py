"""gather, scatter, all_gather_v and reduce_scatter_v (MPI_Gather, MPI_Scatter, MPI_Allgatherv,
MPI_Reduce_scatter): validated here, then run as one group of sends and receives (hpccl/core/p2p.py), on host
and GPU buffers alike; reduce_scatter_v combines what arrived on the calling rank after the group. Each is a
direct schedule: every block goes straight from the rank that has it to the rank that needs it."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from ..errors import HpcclInvalidArgument
from ..ops import as_op
from .p2p import buffer_pair as _pair, run_p2p, vblocks


def _root(comm: Any, root: Any) -> int:
    return comm._rank_arg(root, "root")


def _go(comm: Any, items: List[tuple], what: str) -> None:
    if comm._group is not None:
        comm._p2p.extend(items)
    elif items:
        run_p2p(comm, items, what)


def gather(comm: Any, sendbuf: Any, recvbuf: Any, root: int, stream: Any) -> Any:
    """Every rank's sendbuf (the same count everywhere) into block r of the root's recvbuf (size x count
    elements); recvbuf is ignored on the other ranks (None there is fine)."""
    root = _root(comm, root)
    if comm.rank != root:
        comm._alive("gather")
        m = comm._memory(sendbuf, "gather")
        send, _ = m.view(sendbuf, "sendbuf")
        _go(comm, [("send", root, send, m, m.stream(stream, sendbuf))], "gather")
        return None
    m, send, recv = _pair(comm, "gather", sendbuf, recvbuf)
    c = send.size
    if recv.size != comm.size * c:
        raise HpcclInvalidArgument("recvbuf", f"has {recv.size} elements; the root needs size x count = "
                                              f"{comm.size} x {c}")
    st = m.stream(stream, sendbuf)
    items = [("recv", j, recv[j * c:(j + 1) * c], m, st) for j in range(comm.size)]
    items.append(("send", root, m.clone(send, st) if m.shares(send, recv) else send, m, st))
    _go(comm, items, "gather")
    return recvbuf


def scatter(comm: Any, sendbuf: Any, recvbuf: Any, root: int, stream: Any) -> Any:
    """Block r of the root's sendbuf (size x count elements) into rank r's recvbuf (count elements);
    sendbuf is ignored on the other ranks (None there is fine)."""
    root = _root(comm, root)
    if comm.rank != root:
        comm._alive("scatter")
        if recvbuf is None:
            raise HpcclInvalidArgument("recvbuf", "is required (its size is the count of each block)")
        m = comm._memory(recvbuf, "scatter")
        recv, _ = m.view(recvbuf, "recvbuf")
        m.writable(recv, "recvbuf")
        _go(comm, [("recv", root, recv, m, m.stream(stream, recvbuf))], "scatter")
        return recvbuf
    m, send, recv = _pair(comm, "scatter", sendbuf, recvbuf)
    c = recv.size
    if send.size != comm.size * c:
        raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements; the root needs size x count = "
                                              f"{comm.size} x {c} (count: recvbuf's size)")
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):
        send = m.clone(send, st)
    items = [("send", j, send[j * c:(j + 1) * c], m, st) for j in range(comm.size)]
    items.append(("recv", root, recv, m, st))
    _go(comm, items, "scatter")
    return recvbuf


def all_gather_v(comm: Any, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int],
                 displs: Optional[Sequence[int]], stream: Any) -> Any:
    """Rank r's sendbuf (recvcounts[r] elements) into every rank's recvbuf at displs[r] (default: the packed
    prefix sums of recvcounts)."""
    m, send, recv = _pair(comm, "all_gather_v", sendbuf, recvbuf)
    blocks = vblocks(comm.size, recvcounts, displs, recv.size, "recvcounts", "displs", "recvbuf", True)
    me = comm.rank
    if send.size != blocks[me][1]:
        raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements but recvcounts[{me}] is {blocks[me][1]}")
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):
        send = m.clone(send, st)
    items = [("send", j, send, m, st) for j in range(comm.size) if send.size]
    items += [("recv", j, recv[o:o + c], m, st) for j, (o, c) in enumerate(blocks) if c]
    _go(comm, items, "all_gather_v")
    return recvbuf


def reduce_scatter_v(comm: Any, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int], op: Any,
                     stream: Any) -> Any:
    """Block j of every rank's sendbuf (recvcounts[j] elements, packed in rank order) reduced with op into
    rank j's recvbuf (recvcounts[j] elements)."""
    op = as_op(op)
    m, send, recv = _pair(comm, "reduce_scatter_v", sendbuf, recvbuf)
    if comm._group is not None:
        raise HpcclInvalidArgument("reduce_scatter_v", "cannot be held in a group (it combines after its "
                                                       "messages arrive)")
    blocks = vblocks(comm.size, recvcounts, None, send.size, "recvcounts", "recvcounts", "sendbuf", True)
    total = sum(c for _, c in blocks)
    if send.size != total:
        raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements but recvcounts add up to {total}")
    me, n = comm.rank, comm.size
    mine = blocks[me][1]
    if recv.size != mine:
        raise HpcclInvalidArgument("recvbuf", f"has {recv.size} elements but recvcounts[{me}] is {mine}")
    dt = m.dtype(send)
    if m.kind != "host":
        m.prepare(dt, op)  # the combining kernels loaded before the group holds the stream
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):
        send = m.clone(send, st)
    got = [m.empty(mine, dt) for _ in range(n)]
    items = [("send", j, send[o:o + c], m, st) for j, (o, c) in enumerate(blocks) if c]
    items += [("recv", j, got[j], m, st) for j in range(n) if mine]
    if items:
        run_p2p(comm, items, "reduce_scatter_v")
    if mine:
        with _on(m, st):
            m.copy(recv, got[0])
            for j in range(1, n):
                m.reduce(recv, recv, got[j], op)
            m.finish(recv, op, n)
    return recvbuf


class _on:
    """The device memory component's kernels on stream ``st`` (host memory: nothing to do)."""

    def __init__(self, m: Any, st: Any) -> None:
        self.ctx = None
        if getattr(m, "kind", "host") != "host" and st:
            import cupy
            self.ctx = cupy.cuda.ExternalStream(st)

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
