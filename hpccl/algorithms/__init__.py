"""The one algorithm table: every collective's named algorithms, with what serves each memory kind.

An entry's ``fn`` runs on host memory over hpccl.runtime.primitives; ``cuda`` runs on device memory: either a GPU
kernel over peer memory (scope 'node': ranks of one node) or the same host schedule over device
primitives driven by the network path (scope 'net': every peer across the network; each exchange a staged
step on the native engine, or over MPI a step of the proxy thread). 'hier' (hier.py) composes node steps and a network step and serves both kinds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional

from . import direct, gpu, hier, linear, ring, single_copy, tree, vsched

HOST, CUDA = "host", "cuda"
#: collectives of blocks of any size: their host calls are planned from this table; device calls (and calls held in
#: a group()) run as one group of sends and receives, stream-ordered (hpccl/core/vcolls.py)
VCOLLS = ("gather", "scatter", "all_gather_v", "reduce_scatter_v")


@dataclass(frozen=True)
class Algorithm:
    """A named entry: the host function (or None), what it needs (a mapped shared-memory window on one
    node; single-copy reads between processes), the device function (or None) and its scope."""

    name: str
    fn: Optional[Callable]
    doc: str
    needs_window: bool = False
    needs_single_copy: bool = False
    cuda: Optional[Callable] = None
    cuda_scope: str = "net"   # 'node': a GPU kernel on one node; 'net': over the network proxy

    def serves(self, kind: str, lay: "Layout") -> bool:
        if kind == HOST:
            return (self.fn is not None and (not self.needs_window or lay.window)
                    and (not self.needs_single_copy or lay.single_copy))
        if self.cuda is None:
            return False
        return lay.nodes == 1 if self.cuda_scope == "node" else lay.nodes > 1


class Layout(NamedTuple):
    """What a communicator offers the algorithms: nodes, ranks per node (equal on every node or not), a
    shared-memory window (one node, host) and single-copy reads."""

    nodes: int
    local: int
    equal: bool
    window: bool = False
    single_copy: bool = False


def _table() -> Dict[str, Dict[str, Algorithm]]:
    A = Algorithm
    return {
        "all_reduce": {a.name: a for a in [
            A("cma", single_copy.all_reduce, "stripes reduced from peers' buffers, one kernel copy each", True, True),
            A("ring", ring.all_reduce, "reduce-scatter + all-gather around a ring, pipelined in slots",
              cuda=ring.all_reduce),
            A("tree", tree.all_reduce, "binomial reduce to rank 0, then binomial broadcast", cuda=tree.all_reduce),
            A("rd", tree.rd_all_reduce, "recursive doubling on whole buffers (log2 n steps)",
              cuda=tree.rd_all_reduce),
            A("dbtree", tree.dbtree_all_reduce, "double binary tree, halves pipelined in pieces",
              cuda=tree.dbtree_all_reduce),
            A("oneshot", direct.all_reduce_oneshot, "every rank reduces all windows itself (GPU: push to "
              "every peer, one kernel)", True, cuda=gpu.all_reduce_oneshot, cuda_scope="node"),
            A("twoshot", direct.all_reduce_twoshot, "each rank reduces its stripe, all copy stripes (GPU: one "
              "kernel, reduce then push)", True, cuda=gpu.all_reduce_twoshot, cuda_scope="node"),
        ]},
        "all_gather": {a.name: a for a in [
            A("cma", single_copy.all_gather, "read every peer's sendbuf with one kernel copy", True, True),
            A("ring", ring.all_gather, "pass blocks around a ring", cuda=ring.all_gather),
            A("direct", direct.all_gather, "copy every rank's window (GPU: copy-push kernel)", True,
              cuda=gpu.all_gather, cuda_scope="node"),
        ]},
        "reduce_scatter": {a.name: a for a in [
            A("cma", single_copy.reduce_scatter, "reduce this block from peers' buffers", True, True),
            A("ring", ring.reduce_scatter, "partial sums travel the ring, n-1 steps", cuda=ring.reduce_scatter),
            A("direct", direct.reduce_scatter, "each rank reduces its block from every window (GPU: "
              "reduce-push kernel)", True, cuda=gpu.reduce_scatter, cuda_scope="node"),
        ]},
        "broadcast": {a.name: a for a in [
            A("cma", single_copy.broadcast, "read the root's buffer with one kernel copy", True, True),
            A("tree", tree.broadcast, "binomial tree from the root", cuda=tree.broadcast),
            A("ring", ring.broadcast, "pipelined chain from the root, in pieces", cuda=ring.broadcast),
            A("direct", direct.broadcast, "root fills its window, all copy it (GPU: copy-push kernel)", True,
              cuda=gpu.broadcast, cuda_scope="node"),
        ]},
        "reduce": {a.name: a for a in [
            A("cma", single_copy.reduce, "root reduces from peers' buffers", True, True),
            A("tree", tree.reduce, "binomial tree to the root", cuda=tree.reduce),
            A("direct", direct.reduce, "root reduces every window (GPU: reduce-push kernel)", True,
              cuda=gpu.reduce, cuda_scope="node"),
        ]},
        "all_to_all": {a.name: a for a in [
            A("cma", single_copy.all_to_all, "read this rank's block of every peer's sendbuf", True, True),
            A("linear", linear.all_to_all, "all pairs at once", cuda=linear.all_to_all),
            A("direct", direct.all_to_all, "each rank copies its block out of every window (GPU: copy-push "
              "kernel)", True, cuda=gpu.all_to_all, cuda_scope="node"),
        ]},
        # blocks of any size (zero included); device memory runs them as one group of sends and receives
        "gather": {a.name: a for a in [
            A("direct", vsched.gather_direct, "the root receives every block at once"),
            A("tree", vsched.gather_tree, "binomial tree: subtrees' blocks in one message each"),
        ]},
        "scatter": {a.name: a for a in [
            A("direct", vsched.scatter_direct, "the root sends every block at once"),
            A("tree", vsched.scatter_tree, "binomial tree: subtrees' blocks in one message each"),
        ]},
        "all_gather_v": {a.name: a for a in [
            A("direct", vsched.all_gather_v_direct, "each rank's block broadcast to all at once"),
            A("ring", vsched.all_gather_v_ring, "variable blocks passed around a ring"),
        ]},
        "reduce_scatter_v": {a.name: a for a in [
            A("direct", vsched.reduce_scatter_v_direct, "blocks sent to their owners, combined in rank order"),
            A("ring", vsched.reduce_scatter_v_ring, "variable partial sums travel the ring, n-1 steps"),
        ]},
    }


ALGORITHMS: Dict[str, Dict[str, Algorithm]] = _table()


def eligible(coll: str, kind: str, lay: Layout) -> List[str]:
    """The algorithms that can run ``coll`` on ``kind`` memory over this layout, 'hier' included."""
    names = [a.name for a in ALGORITHMS[coll].values() if a.serves(kind, lay)]
    if hier.fits(coll, lay):
        names.append("hier")
    return names
