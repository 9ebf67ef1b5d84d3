"""Hierarchical collectives for communicators spanning nodes: fast steps inside each node (shared memory
or GPU peer memory), then the network between nodes, composed from the sub-communicators' collectives.
Needs the same number of ranks on every node. The communicator hands in its Steps: hier knows no communicator."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

from ..ops import AVG, SUM
from .parts import offsets

_SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def fits(coll: str, lay) -> bool:
    """Several nodes with the same number of ranks each, more than one (else flat is the same thing)."""
    return coll in _SUPPORTED and lay.equal and lay.nodes > 1 and lay.local > 1


class Steps:
    """What hier needs of a communicator: where the rank sits (rank, size, local_rank, local_size, num_nodes,
    nodes: the NodeMap) and how to run a step, on flat arrays, on its node's ('intra') or its network
    ('inter') sub-communicator: ``intra(coll, *args, stream=...)`` and ``inter`` likewise."""

    __slots__ = ("rank", "size", "local_rank", "local_size", "num_nodes", "nodes", "_intra", "_inter", "_stream",
                 "_temp")

    def __init__(self, rank: int, size: int, local_rank: int, local_size: int, num_nodes: int, nodes: Any,
                 intra: Callable[..., None], inter: Callable[..., None], stream: Any = None,
                 temp: Optional[Callable[[Any, int], Any]] = None) -> None:
        self.rank, self.size, self.local_rank, self.local_size = rank, size, local_rank, local_size
        self.num_nodes, self.nodes = num_nodes, nodes
        self._intra, self._inter, self._stream = intra, inter, stream
        self._temp = temp or _empty

    def temp(self, like: Any, count: int) -> Any:
        """A flat temporary of like's memory kind and dtype; under CUDA graph capture the communicator
        keeps it as long as the graph may replay (a graph writes into it at every replay)."""
        return self._temp(like, count)

    def node(self, coll: str, *args: Any) -> None:
        """One step among the ranks of this node (shared memory or GPU kernels), on the caller's stream."""
        self._intra(coll, *args, stream=self._stream)

    def net(self, coll: str, *args: Any) -> None:
        """One step among the ranks of this local rank on every node (the network), on the caller's stream."""
        self._inter(coll, *args, stream=self._stream)


def _inter_rank(s: Steps, rank: int) -> int:
    """Rank that ``rank`` has in the inter-node communicator of its local rank."""
    l = s.nodes.local_rank(rank)
    peers = [r for r in range(s.size) if s.nodes.local_rank(r) == l]
    return peers.index(rank)


def _groups(s: Steps) -> List[List[int]]:
    """Ranks of each local rank l across the nodes, in parent-rank order (= inter-communicator order)."""
    return [[r for r in range(s.size) if s.nodes.local_rank(r) == l] for l in range(s.local_size)]


def _empty(like, count: int):
    """A new flat array of like's memory kind and dtype (np.empty_like hands CuPy arrays to CuPy, on
    the current stream: the caller's, set by the front end)."""
    return np.empty_like(like, shape=(count,))


def run(steps: Steps, coll: str, *args: Any) -> None:
    """One hierarchical collective on flat arrays of either memory kind; every sub-step is a call of the
    'intra' (node: shared memory or GPU kernels) or 'inter' (network) sub-communicator."""
    s, node, net = steps, steps.node, steps.net
    L, M = s.local_size, s.num_nodes

    if coll == "all_reduce":
        send, recv, op = args
        op = SUM if op is AVG else op
        if send.size % L == 0:  # node reduce-scatter, network all_reduce of 1/L, node all-gather
            part = s.temp(send, send.size // L)
            node("reduce_scatter", send, part, op)
            net("all_reduce", part, part, op)
            node("all_gather", part, recv)
            return
        off = offsets(send.size, L)
        for l in range(L):  # uneven split: node-local reduce of part l onto local rank l
            if off[l + 1] > off[l]:
                part = slice(off[l], off[l + 1])
                node("reduce", send[part], recv[part] if s.local_rank == l else send[part], l, op)
        mine = recv[off[s.local_rank]:off[s.local_rank + 1]]
        if mine.size:
            net("all_reduce", mine, mine, op)
        for l in range(L):
            if off[l + 1] > off[l]:
                node("broadcast", recv[off[l]:off[l + 1]], recv[off[l]:off[l + 1]], l)
    elif coll == "all_gather":
        send, recv = args
        c, groups = send.size, _groups(s)
        across = s.temp(send, M * c)                         # this local rank's peers on every node
        net("all_gather", send, across)
        local = s.temp(send, L * M * c)                      # (L, nodes * c)
        node("all_gather", across, local)
        for l in range(L):
            for m, rank in enumerate(groups[l]):
                recv[rank * c:(rank + 1) * c] = local[(l * M + m) * c:(l * M + m + 1) * c]
    elif coll == "reduce_scatter":
        send, recv, op = args
        op = SUM if op is AVG else op
        c, groups = recv.size, _groups(s)
        order = s.temp(send, send.size)                      # send's blocks grouped by local rank
        for i, rank in enumerate(rank for l in range(L) for rank in groups[l]):
            order[i * c:(i + 1) * c] = send[rank * c:(rank + 1) * c]
        part = s.temp(send, M * c)                           # blocks of the ranks sharing my local rank
        node("reduce_scatter", order, part, op)
        net("reduce_scatter", part, recv, op)
    elif coll == "broadcast":
        send, recv, root = args
        lroot = s.nodes.local_rank(root)
        if s.local_rank == lroot:
            net("broadcast", send if s.rank == root else recv, recv, _inter_rank(s, root))
        node("broadcast", recv, recv, lroot)
    elif coll == "reduce":
        send, recv, root, op = args
        op = SUM if op is AVG else op
        lroot = s.nodes.local_rank(root)
        if s.local_rank == lroot:
            tmp = s.temp(send, send.size)
            node("reduce", send, tmp, lroot, op)
            net("reduce", tmp, recv if s.rank == root else tmp, _inter_rank(s, root), op)
        else:
            node("reduce", send, send, lroot, op)
    else:  # pragma: no cover - guarded by fits()
        raise ValueError(coll)
