"""Point to point and groups: send, recv, receive from any source, all_to_all_v (a group of sends and
receives) and group(), for host and device buffers alike. Functions of the communicator, which validates
buffers and runs the Calls these build (Communicator.send and the others call them)."""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from .call import Call
from ..gpu.cuda_context import check_capture
from ..errors import HpcclInvalidArgument, HpcclInvalidUsage, HpcclUnsupported
from ..memory.interop import memory_kind
from ..memory import host

# the Calls of sends and receives: ranks legitimately call different ones, so HPCCL_CHECK does not compare them
NAMES = ("send", "recv", "group(send/recv)", "recv(any source)")
Item = Tuple[str, int, Any, Any, Any]  # (send|recv, peer, flat buffer, memory, stream)


def p2p_call(comm: Any, kind: str, buf: Any, peer: int, stream: Any) -> None:
    """One send or recv, validated: run now, or held until the end of the group it is in."""
    comm._alive(kind)
    peer = comm._rank_arg(peer, "peer")
    m = comm._memory(buf, kind)
    flat, _ = m.view(buf, "buf")
    if kind == "recv":
        m.writable(flat, "buf")
    st = m.stream(stream, buf)
    item = (kind, peer, flat, m, st)
    if comm._group is not None:
        comm._p2p.append(item)
    else:
        run_p2p(comm, [item])


def recv_any(comm: Any, buf: Any) -> int:
    """Receive the next message any peer sends into host buf; returns the sender. Peers are probed in turn
    from the one after the last sender, so none is starved."""
    comm._alive("recv")
    m = comm._memory(buf, "recv")
    if m is not host:
        raise HpcclUnsupported("recv from any source takes host buffers; on GPU buffers name the source "
                               "rank (NCCL has no receive from any source either)")
    if comm._group is not None:
        raise HpcclInvalidUsage("recv from any source inside group(): its sender is known only when it runs")
    flat, _ = m.view(buf, "buf")
    m.writable(flat, "buf")
    peers = [p for p in range(comm.size) if p != comm.rank]
    if not peers:
        raise HpcclInvalidUsage("recv from any source on a communicator of one rank: no peer can send")
    start = comm._any_next % len(peers)
    order = peers[start:] + peers[:start]
    tr = comm._prim._transport_of
    got: List[int] = []

    def ready() -> bool:
        for p in order:
            if tr[p].probe(p):
                got.append(p)
                return True
        return False

    def run(c: Any, call: Call) -> None:
        if not ready():
            c._waiter.wait(ready, lambda: [] if got else list(peers))
        c._prim.exchange(recvs=[(got[0], flat, None)], p2p=True)
    comm._run(Call("recv(any source)", host, None, 0, (), fn=run))
    comm._any_next = peers.index(got[0]) + 1
    return got[0]


def all_to_all_v(comm: Any, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int], recvcounts: Sequence[int],
                 sdispls: Optional[Sequence[int]], rdispls: Optional[Sequence[int]], stream: Any) -> Any:
    """MPI_Alltoallv, validated, as a group of sends and receives (see Communicator.all_to_all_v)."""
    m, send, recv = buffer_pair(comm, "all_to_all_v", sendbuf, recvbuf, "recvcounts and rdispls")
    sblocks = vblocks(comm.size, sendcounts, sdispls, send.size, "sendcounts", "sdispls", "sendbuf", False)
    rblocks = vblocks(comm.size, recvcounts, rdispls, recv.size, "recvcounts", "rdispls", "recvbuf", True)
    r = comm.rank
    if sblocks[r][1] != rblocks[r][1]:
        raise HpcclInvalidArgument("recvcounts", f"recvcounts[{r}] = {rblocks[r][1]} but this rank sends "
                                                 f"itself sendcounts[{r}] = {sblocks[r][1]}")
    st = m.stream(stream, sendbuf)
    if m.shares(send, recv):  # blocks may be read after others are written
        send = m.clone(send, st)
    items = [("send", j, send[o:o + c], m, st) for j, (o, c) in enumerate(sblocks) if c]
    items += [("recv", j, recv[o:o + c], m, st) for j, (o, c) in enumerate(rblocks) if c]
    if comm._group is not None:
        comm._p2p.extend(items)
    elif items:
        run_p2p(comm, items, "all_to_all_v")
    return recvbuf


def buffer_pair(comm: Any, what: str, sendbuf: Any, recvbuf: Any, sized_by: str = "the counts") -> tuple:
    """(memory component, flat send, flat recv) of a call's two buffers, checked: one memory kind and dtype,
    recvbuf given (its size follows from ``sized_by``) and writable."""
    comm._alive(what)
    m = comm._memory(sendbuf, what)
    send, _ = m.view(sendbuf, "sendbuf")
    if recvbuf is None:
        raise HpcclInvalidArgument("recvbuf", f"is required (its size follows from {sized_by})")
    if comm._memory(recvbuf, "recvbuf") is not m:
        raise HpcclInvalidArgument("recvbuf", f"is {memory_kind(recvbuf)} memory but sendbuf is {m.kind} memory")
    recv, _ = m.view(recvbuf, "recvbuf")
    m.writable(recv, "recvbuf")
    if m.dtype(recv) != m.dtype(send):
        raise HpcclInvalidArgument("recvbuf", f"dtype {m.dtype(recv)} differs from sendbuf's {m.dtype(send)}")
    return m, send, recv


def vblocks(size: int, counts: Sequence[int], displs: Optional[Sequence[int]], total: int, cname: str,
            dname: str, bname: str, disjoint: bool) -> List[Tuple[int, int]]:
    """[(offset, count)] per rank, checked: one per rank, non-negative, inside the buffer, and (for the
    receive side) not overlapping one another."""
    def ints(seq: Any, name: str) -> List[int]:
        try:
            vals = [int(v) for v in seq]
        except (TypeError, ValueError):
            raise HpcclInvalidArgument(name, f"{seq!r} is not a sequence of integers") from None
        if len(vals) != size:
            raise HpcclInvalidArgument(name, f"has {len(vals)} entries, needs one per rank ({size})")
        bad = [i for i, v in enumerate(vals) if v < 0]
        if bad:
            raise HpcclInvalidArgument(name, f"entry {bad[0]} is negative ({vals[bad[0]]})")
        return vals
    cs = ints(counts, cname)
    if displs is None:  # packed: disjoint by construction, inside the buffer when the last block is
        ds = [0, *itertools.accumulate(cs)]
        if ds[-1] <= total:
            return list(zip(ds, cs))
        ds.pop()
    else:
        ds = ints(displs, dname)
    for j, (o, c) in enumerate(zip(ds, cs)):
        if o + c > total:
            raise HpcclInvalidArgument(cname if displs is None else dname,
                                       f"block {j} ({c} elements at {o}) ends past {bname}'s {total} elements")
    if disjoint:
        spans = sorted((o, o + c, j) for j, (o, c) in enumerate(zip(ds, cs)) if c)
        for (_, e0, j0), (s1, _, j1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise HpcclInvalidArgument(dname, f"blocks {j0} and {j1} of {bname} overlap")
    return list(zip(ds, cs))


def run_p2p(comm: Any, items: List[Item], what: Optional[str] = None) -> None:
    """Sends and receives run together, host and device each as one Call (no ordering deadlock).
    Messages to self are matched in order with receives from self and must have the same size."""
    self_sends = [x[2] for x in items if x[0] == "send" and x[1] == comm.rank]
    self_recvs = [x[2] for x in items if x[0] == "recv" and x[1] == comm.rank]
    if len(self_sends) != len(self_recvs) or any(a.nbytes != b.nbytes for a, b in zip(self_sends, self_recvs)):
        raise HpcclInvalidArgument("buf", "sends to this rank itself must pair, in order, with receives from "
                                          "itself of the same size")
    hosts = [x for x in items if x[3] is host]
    devs = [x for x in items if x[3] is not host]
    if hosts:
        sends = [(peer, b) for k, peer, b, _, _ in hosts if k == "send"]
        recvs = [(peer, b, None) for k, peer, b, _, _ in hosts if k == "recv"]
        name = what or (hosts[0][0] if len(hosts) == 1 else "group(send/recv)")
        comm._run(Call(name, host, None, 0, (),
                       fn=lambda c, call: c._prim.exchange(sends, recvs, p2p=True)))
    if devs:
        comm._run(Call(what or "group(send/recv)", devs[0][3], devs[0][4], 0, tuple(devs), fn=device_p2p))


def device_p2p(comm: Any, call: Call) -> None:
    """Device sends/receives of one group on the first op's stream; other streams are joined to it
    before (their earlier work) and after (the results), as NCCL ties a group's streams."""
    dev, items, st = comm._dev, call.args, call.stream
    others = sorted({x[4] for x in items} - {st})
    import cupy
    rt = cupy.cuda.runtime

    def join(src: int, dst: int) -> None:
        ev = cupy.cuda.Event(block=False, disable_timing=True)
        rt.eventRecord(ev.ptr, src)
        rt.streamWaitEvent(dst, ev.ptr, 0)
    for o in others:
        join(o, st)
    me = comm.rank
    sends = [(peer, b) for k, peer, b, _, _ in items if k == "send" and peer != me]
    recvs = [(peer, b) for k, peer, b, _, _ in items if k == "recv" and peer != me]
    mine = zip([b for k, p, b, _, _ in items if k == "send" and p == me],
               [b for k, p, b, _, _ in items if k == "recv" and p == me])
    for src, dst in mine:  # to self: a copy on the group's stream
        if dst.nbytes:
            rt.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, 3, st)
    if dev.engine is not None:
        dev.engine.group_p2p(sends, recvs, st)
    elif sends or recvs:
        prim, seq = dev.prim, comm._seq
        dev.proxy.enqueue(st, lambda: prim.exchange(sends, [(p, b, None) for p, b in recvs]),
                          f"{call.coll} #{seq}")
    for o in others:
        join(st, o)


@contextlib.contextmanager
def group(comm: Any) -> Iterator[None]:
    """The group context (see Communicator.group): sends and receives held inside run together at the end,
    then the collectives held, in call order; nested groups join the outermost."""
    comm._alive("group")
    outer = comm._group_depth == 0
    eng = comm._dev.engine if outer and comm._dev is not None else None
    if outer:
        comm._group, comm._p2p = [], []
        if eng is not None:
            eng.fs.held += 1  # compiled replays (the torch backend's) queue nothing: they step aside
    comm._group_depth += 1
    try:
        yield
    except BaseException:
        if outer:
            comm._group, comm._p2p = None, []
        raise
    finally:
        comm._group_depth -= 1
        if eng is not None:
            eng.fs.held -= 1
    if outer:
        calls, p2p = comm._group, comm._p2p
        comm._group, comm._p2p = None, []
        for call in calls:  # a graph-capture refusal comes before anything of the group is enqueued
            if call.mem is not host and call.stream is not None:
                check_capture(comm, call.stream, call.coll)
        if p2p:
            run_p2p(comm, p2p)
        for call in calls:
            comm._run(call)
