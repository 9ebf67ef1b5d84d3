"""Which ranks share a node: by hostname, or by HPCCL_NODE_ID / an explicit node_id for tests."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import List, Optional

from .. import config


@dataclass(frozen=True)
class NodeMap:
    """Node layout of one communicator: node index per rank, this rank's local rank and its node's ranks."""

    node_of: List[int]          # node index (0..num_nodes-1) of each rank, numbered by first appearance
    node_names: List[str]

    def ranks_on(self, node: int) -> List[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    def local_rank(self, rank: int) -> int:
        return self.ranks_on(self.node_of[rank]).index(rank)

    def leaders(self) -> List[int]:
        """Lowest rank of each node, in node order."""
        return [self.ranks_on(n)[0] for n in range(self.num_nodes)]


def node_name(world_rank: int, override: Optional[str] = None) -> str:
    """This process's node name: the override, HPCCL_NODE_ID ('split:K' puts K world ranks per node) or the hostname."""
    value = override if override is not None else config.get("HPCCL_NODE_ID")
    if value:
        if value.startswith("split:"):
            return f"node{world_rank // int(value[6:])}"
        return value
    return socket.gethostname()


def detect_nodes(names: List[str]) -> NodeMap:
    """Build the map from every rank's node name (gathered by the bootstrap)."""
    order: List[str] = []
    for n in names:
        if n not in order:
            order.append(n)
    return NodeMap([order.index(n) for n in names], order)
