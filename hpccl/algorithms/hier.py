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

_SUPPORTED = ("all_reduce", "broadcast", "reduce")


def supports(comm: "Communicator", coll: str) -> bool:
    sizes = {len(comm.nodes.ranks_on(n)) for n in range(comm.num_nodes)}
    return coll in _SUPPORTED and len(sizes) == 1


def _inter_rank(comm: "Communicator", rank: int) -> int:
    """Rank that ``rank`` has in the inter-node communicator of its local rank."""
    l = comm.nodes.local_rank(rank)
    peers = [r for r in range(comm.size) if comm.nodes.local_rank(r) == l]
    return peers.index(rank)


def run(comm: "Communicator", coll: str, *args) -> None:
    intra, inter = comm._subcomm("intra"), comm._subcomm("inter")
    if coll == "all_reduce":
        send, recv, op = args
        op = SUM if op is AVG else op
        L = comm.local_size
        off = offsets(send.size, L)
        for l in range(L):  # node-local reduce of part l onto local rank l
            part = slice(off[l], off[l + 1])
            if off[l + 1] > off[l]:
                intra.reduce(send[part], recv[part] if comm.local_rank == l else None, root=l, op=op)
        mine = recv[off[comm.local_rank]:off[comm.local_rank + 1]]
        if mine.size:
            inter.all_reduce(mine, op=op)
        for l in range(L):
            if off[l + 1] > off[l]:
                intra.broadcast(recv[off[l]:off[l + 1]], root=l)
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


