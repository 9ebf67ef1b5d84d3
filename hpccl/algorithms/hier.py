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


def supports(comm: "Communicator", coll: str) -> bool:
    """Several nodes with the same number of ranks each, more than one (else flat is the same thing)."""
    sizes = {len(comm.nodes.ranks_on(n)) for n in range(comm.num_nodes)}
    return coll in _SUPPORTED and len(sizes) == 1 and comm.num_nodes > 1 and comm.local_size > 1


def _inter_rank(comm: "Communicator", rank: int) -> int:
    """Rank that ``rank`` has in the inter-node communicator of its local rank."""
    l = comm.nodes.local_rank(rank)
    peers = [r for r in range(comm.size) if comm.nodes.local_rank(r) == l]
    return peers.index(rank)


def _groups(comm: "Communicator"):
    """Ranks of each local rank l across the nodes, in parent-rank order (= inter-communicator order)."""
    L = comm.local_size
    return [[r for r in range(comm.size) if comm.nodes.local_rank(r) == l] for l in range(L)]


def run(comm: "Communicator", coll: str, *args) -> None:
    intra, inter = comm._subcomm("intra"), comm._subcomm("inter")
    L = comm.local_size
    if coll == "all_reduce":
        send, recv, op = args
        op = SUM if op is AVG else op
        if send.size % L == 0:  # node reduce-scatter, network all_reduce of 1/L, node all-gather
            part = intra.reduce_scatter(send, op=op)
            if part.size:
                inter.all_reduce(part, op=op)
            intra.all_gather(part, recv)
            return
        off = offsets(send.size, L)
        for l in range(L):  # uneven split: node-local reduce of part l onto local rank l
            if off[l + 1] > off[l]:
                part = slice(off[l], off[l + 1])
                intra.reduce(send[part], recv[part] if comm.local_rank == l else None, root=l, op=op)
        mine = recv[off[comm.local_rank]:off[comm.local_rank + 1]]
        if mine.size:
            inter.all_reduce(mine, op=op)
        for l in range(L):
            if off[l + 1] > off[l]:
                intra.broadcast(recv[off[l]:off[l + 1]], root=l)
    elif coll == "all_gather":
        send, recv = args
        c, groups = send.size, _groups(comm)
        across = inter.all_gather(send)                      # (nodes, c): this local rank's peers
        local = intra.all_gather(across.reshape(-1))         # (L, nodes * c)
        for l in range(L):
            for m, rank in enumerate(groups[l]):
                recv[rank * c:(rank + 1) * c] = local[l, m * c:(m + 1) * c]
    elif coll == "reduce_scatter":
        send, recv, op = args
        op = SUM if op is AVG else op
        c, groups = recv.size, _groups(comm)
        order = np.concatenate([send[rank * c:(rank + 1) * c] for l in range(L) for rank in groups[l]])
        part = intra.reduce_scatter(order, op=op)            # blocks of the ranks sharing my local rank
        inter.reduce_scatter(part, recv, op=op)
    elif coll == "broadcast":
        send, recv, root = args
        lroot = comm.nodes.local_rank(root)
        if comm.local_rank == lroot:
            inter.broadcast(send if comm.rank == root else recv, root=_inter_rank(comm, root),
                            recvbuf=recv if comm.rank == root and send is not recv else None)
        intra.broadcast(recv, root=lroot)
    elif coll == "reduce":
        send, recv, root, op = args
        op = SUM if op is AVG else op
        lroot = comm.nodes.local_rank(root)
        tmp = np.empty_like(send) if comm.local_rank == lroot else None
        intra.reduce(send, tmp, root=lroot, op=op)
        if comm.local_rank == lroot:
            inter.reduce(tmp, recv if comm.rank == root else None, root=_inter_rank(comm, root), op=op)
    else:  # pragma: no cover - guarded by supports()
        raise ValueError(coll)
