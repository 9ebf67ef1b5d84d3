"""gather, scatter, all_gather_v and reduce_scatter_v (MPI_Gather, MPI_Scatter, MPI_Allgatherv,
MPI_Reduce_scatter): validated here (counts per rank, displacements, root; an error naming the argument
before any data moves), then run. Host calls are planned: on one node's compiled hot path with blocks padded
to the largest (hpccl/core/vpad.py) where that moves at most about twice the bytes, else the schedule of
the algorithm table the cost model prices lowest (direct, binomial tree or ring: hpccl/algorithms/vsched.py;
HPCCL_ALGO pins one). Device calls and calls held in a group() run as one group of sends and receives on the
caller's stream (the direct schedule), combined on that stream for reduce_scatter_v: no host sync."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from . import vpad
from .call import Call
from .dispatch import declined, planned
from ..errors import HpcclInvalidArgument
from ..memory import host
from ..memory.interop import HOST
from ..ops import AVG, as_op, check_op_dtype
from .planner import HOT
from .p2p import buffer_pair as _pair, run_p2p, vblocks

Blocks = Tuple[Tuple[int, int], ...]


def _root(comm: Any, root: Any) -> int:
    return comm._rank_arg(root, "root")


def _go(comm: Any, items: List[tuple], what: str) -> None:
    if comm._group is not None:
        comm._p2p.extend(items)
    elif items:
        run_p2p(comm, items, what)


_EVEN: dict = {}


def _even(n: int, c: int) -> Blocks:
    """n blocks of c elements, packed (kept: small calls repeat)."""
    b = _EVEN.get((n, c))
    if b is None:
        if len(_EVEN) > 256:
            _EVEN.clear()
        b = _EVEN[(n, c)] = tuple((j * c, c) for j in range(n))
    return b


def _planned(comm: Any, coll: str, args: tuple, blocks: Blocks, op: Any = None, finish: Any = None) -> None:
    """A validated host call run by its plan; nothing moves when every block is empty (on every rank)."""
    nbytes = (blocks[0][1] * len(blocks) if coll == "gather" or coll == "scatter"
              else sum(c for _, c in blocks)) * args[0].itemsize
    if nbytes and not (comm._front and vpad.front(comm, coll, args, nbytes)):
        comm._run(Call(coll, host, None, nbytes, args, op=op, finish=finish, fn=_host))


def _host(comm: Any, call: Call) -> None:
    p = planned(comm, call.coll, call.nbytes, HOST)
    if p.route == HOT:
        if vpad.run(comm, call):
            return
        p = declined(comm, call, p)
    p.spec.fn(comm._prim, *call.args)
    if call.finish is not None:
        host.finish(call.finish, call.op, comm.size)


def _host_now(comm: Any, m: Any) -> bool:
    """Host memory outside a group(): planned. Device memory and held calls: one group of sends and receives."""
    return m is host and comm._group is None


def _temp(comm: Any, m: Any, like: Any, count: int, st: Any) -> Any:
    """A device temporary on ``st``; under graph capture one the communicator keeps while the graph may replay."""
    if comm._dev is not None and st and comm._dev.capturing(st):
        return comm._dev.graph_temp(like, count)
    return m.empty(count, m.dtype(like))


def _aside(comm: Any, m: Any, send: Any, st: Any) -> Any:
    """A private copy of an input that overlaps the output, ordered on ``st`` (capture-safe)."""
    if m is host:
        return m.clone(send, st)
    t = _temp(comm, m, send, send.size, st)
    with _on(m, st):
        m.copy(t, send)
    return t


def gather(comm: Any, sendbuf: Any, recvbuf: Any, root: int, stream: Any) -> Any:
    """Every rank's sendbuf (the same count everywhere) into block r of the root's recvbuf (size x count
    elements); recvbuf is ignored on the other ranks (None there is fine)."""
    root = _root(comm, root)
    if comm.rank != root:
        comm._alive("gather")
        m = comm._memory(sendbuf, "gather")
        send, _ = m.view(sendbuf, "sendbuf")
        if _host_now(comm, m):
            blocks = _even(comm.size, send.size)
            _planned(comm, "gather", (send, send[:0], blocks, root), blocks)
        else:
            _go(comm, [("send", root, send, m, m.stream(stream, sendbuf))], "gather")
        return None
    m, send, recv = _pair(comm, "gather", sendbuf, recvbuf)
    c = send.size
    if recv.size != comm.size * c:
        raise HpcclInvalidArgument("recvbuf", f"has {recv.size} elements; the root needs size x count = "
                                              f"{comm.size} x {c}")
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):
        send = _aside(comm, m, send, st)
    blocks = _even(comm.size, c)
    if _host_now(comm, m):
        _planned(comm, "gather", (send, recv, blocks, root), blocks)
        return recvbuf
    items = [("recv", j, recv[j * c:(j + 1) * c], m, st) for j in range(comm.size)]
    items.append(("send", root, send, m, st))
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
        if _host_now(comm, m):
            blocks = _even(comm.size, recv.size)
            _planned(comm, "scatter", (recv[:0], recv, blocks, root), blocks)
        else:
            _go(comm, [("recv", root, recv, m, m.stream(stream, recvbuf))], "scatter")
        return recvbuf
    m, send, recv = _pair(comm, "scatter", sendbuf, recvbuf)
    c = recv.size
    if send.size != comm.size * c:
        raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements; the root needs size x count = "
                                              f"{comm.size} x {c} (count: recvbuf's size)")
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):
        send = _aside(comm, m, send, st)
    blocks = _even(comm.size, c)
    if _host_now(comm, m):
        _planned(comm, "scatter", (send, recv, blocks, root), blocks)
        return recvbuf
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
        send = _aside(comm, m, send, st)
    if _host_now(comm, m):
        _planned(comm, "all_gather_v", (send, recv, blocks), blocks)
        return recvbuf
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
    check_op_dtype(op, dt)
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):
        send = _aside(comm, m, send, st)
    if m is host:
        _planned(comm, "reduce_scatter_v", (send, recv, blocks, op), blocks, op, recv if op is AVG else None)
        return recvbuf
    m.prepare(dt, op)  # the combining kernels loaded before the group holds the stream
    got = _temp(comm, m, send, n * mine, st) if mine else None
    items = [("send", j, send[o:o + c], m, st) for j, (o, c) in enumerate(blocks) if c]
    items += [("recv", j, got[j * mine:(j + 1) * mine], m, st) for j in range(n) if mine]
    if items:
        run_p2p(comm, items, "reduce_scatter_v")
    if mine:
        with _on(m, st):
            m.copy(recv, got[:mine])
            for j in range(1, n):
                m.reduce(recv, recv, got[j * mine:(j + 1) * mine], op)
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
