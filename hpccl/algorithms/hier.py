"""Hierarchical collectives for communicators spanning nodes: fast steps inside each node (shared memory
or GPU peer memory), then the network between nodes, composed from the sub-communicators' collectives.
Needs the same number of ranks on every node."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import AVG, SUM
from .parts import offsets

if TYPE_CHECKING:  # pragma: no cover
    from ..comm import Communicator

_SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def fits(coll: str, lay) -> bool:
    """Several nodes with the same number of ranks each, more than one (else flat is the same thing)."""
    return coll in _SUPPORTED and lay.equal and lay.nodes > 1 and lay.local > 1


def supports(comm: "Communicator", coll: str) -> bool:
    return fits(coll, comm.layout)


def _inter_rank(comm: "Communicator", rank: int) -> int:
    """Rank that ``rank`` has in the inter-node communicator of its local rank."""
    l = comm.nodes.local_rank(rank)
    peers = [r for r in range(comm.size) if comm.nodes.local_rank(r) == l]
    return peers.index(rank)


def _groups(comm: "Communicator"):
    """Ranks of each local rank l across the nodes, in parent-rank order (= inter-communicator order)."""
    L = comm.local_size
    return [[r for r in range(comm.size) if comm.nodes.local_rank(r) == l] for l in range(L)]


def _empty(like, count: int):
    """A new flat array of like's memory kind and dtype (np.empty_like hands CuPy arrays to CuPy, on
    the current stream: the caller's, set by the front end)."""
    return np.empty_like(like, shape=(count,))


def run(comm: "Communicator", coll: str, *args, stream=None) -> None:
    """One hierarchical collective on flat arrays of either memory kind; every sub-step is a call of the
    'intra' (node: shared memory or GPU kernels) or 'inter' (network) sub-communicator."""
    intra, inter = comm._subcomm("intra"), comm._subcomm("inter")
    L, M = comm.local_size, comm.num_nodes

    def node(c: str, *a) -> None:
        intra._flat(c, *a, stream=stream)

    def net(c: str, *a) -> None:
        inter._flat(c, *a, stream=stream)

    if coll == "all_reduce":
        send, recv, op = args
        op = SUM if op is AVG else op
        if send.size % L == 0:  # node reduce-scatter, network all_reduce of 1/L, node all-gather
            part = _empty(send, send.size // L)
            node("reduce_scatter", send, part, op)
            net("all_reduce", part, part, op)
            node("all_gather", part, recv)
            return
        off = offsets(send.size, L)
        for l in range(L):  # uneven split: node-local reduce of part l onto local rank l
            if off[l + 1] > off[l]:
                part = slice(off[l], off[l + 1])
                node("reduce", send[part], recv[part] if comm.local_rank == l else send[part], l, op)
        mine = recv[off[comm.local_rank]:off[comm.local_rank + 1]]
        if mine.size:
            net("all_reduce", mine, mine, op)
        for l in range(L):
            if off[l + 1] > off[l]:
                node("broadcast", recv[off[l]:off[l + 1]], recv[off[l]:off[l + 1]], l)
    elif coll == "all_gather":
        send, recv = args
        c, groups = send.size, _groups(comm)
        across = _empty(send, M * c)                         # this local rank's peers on every node
        net("all_gather", send, across)
        local = _empty(send, L * M * c)                      # (L, nodes * c)
        node("all_gather", across, local)
        for l in range(L):
            for m, rank in enumerate(groups[l]):
                recv[rank * c:(rank + 1) * c] = local[(l * M + m) * c:(l * M + m + 1) * c]
    elif coll == "reduce_scatter":
        send, recv, op = args
        op = SUM if op is AVG else op
        c, groups = recv.size, _groups(comm)
        order = np.concatenate([send[rank * c:(rank + 1) * c] for l in range(L) for rank in groups[l]])
        part = _empty(send, M * c)                           # blocks of the ranks sharing my local rank
        node("reduce_scatter", order, part, op)
        net("reduce_scatter", part, recv, op)
    elif coll == "broadcast":
        send, recv, root = args
        lroot = comm.nodes.local_rank(root)
        if comm.local_rank == lroot:
            net("broadcast", send if comm.rank == root else recv, recv, _inter_rank(comm, root))
        node("broadcast", recv, recv, lroot)
    elif coll == "reduce":
        send, recv, root, op = args
        op = SUM if op is AVG else op
        lroot = comm.nodes.local_rank(root)
        if comm.local_rank == lroot:
            tmp = _empty(send, send.size)
            node("reduce", send, tmp, lroot, op)
            net("reduce", tmp, recv if comm.rank == root else tmp, _inter_rank(comm, root), op)
        else:
            node("reduce", send, send, lroot, op)
    else:  # pragma: no cover - guarded by fits()
        raise ValueError(coll)
