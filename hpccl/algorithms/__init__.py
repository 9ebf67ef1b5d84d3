"""Collective algorithms, written only against hpccl.primitives; the table maps names to functions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

from . import direct, linear, ring, single_copy, tree


@dataclass(frozen=True)
class Algorithm:
    """A named entry: the function, what it is good for, and whether it needs a mapped window (one
    shared-memory node) or single-copy reads between processes (cross-memory attach) too."""

    name: str
    fn: Callable
    doc: str
    needs_window: bool = False
    needs_single_copy: bool = False


def _table() -> Dict[str, Dict[str, Algorithm]]:
    A = Algorithm
    return {
        "all_reduce": {a.name: a for a in [
            A("cma", single_copy.all_reduce, "stripes reduced from peers' buffers, one kernel copy each", True, True),
            A("ring", ring.all_reduce, "reduce-scatter + all-gather around a ring, pipelined in slots"),
            A("tree", tree.all_reduce, "binomial reduce to rank 0, then binomial broadcast"),
            A("rd", tree.rd_all_reduce, "recursive doubling on whole buffers (log2 n steps)"),
            A("dbtree", tree.dbtree_all_reduce, "double binary tree, halves pipelined in pieces"),
            A("oneshot", direct.all_reduce_oneshot, "every rank reduces all windows itself", True),
            A("twoshot", direct.all_reduce_twoshot, "each rank reduces its stripe, all copy stripes", True),
        ]},
        "all_gather": {a.name: a for a in [
            A("cma", single_copy.all_gather, "read every peer's sendbuf with one kernel copy", True, True),
            A("ring", ring.all_gather, "pass blocks around a ring"),
            A("direct", direct.all_gather, "copy every rank's window", True),
        ]},
        "reduce_scatter": {a.name: a for a in [
            A("cma", single_copy.reduce_scatter, "reduce this block from peers' buffers", True, True),
            A("ring", ring.reduce_scatter, "partial sums travel the ring, n-1 steps"),
            A("direct", direct.reduce_scatter, "each rank reduces its block from every window", True),
        ]},
        "broadcast": {a.name: a for a in [
            A("cma", single_copy.broadcast, "read the root's buffer with one kernel copy", True, True),
            A("tree", tree.broadcast, "binomial tree from the root"),
            A("ring", ring.broadcast, "pipelined chain from the root, in pieces"),
            A("direct", direct.broadcast, "root fills its window, all copy it", True),
        ]},
        "reduce": {a.name: a for a in [
            A("cma", single_copy.reduce, "root reduces from peers' buffers", True, True),
            A("tree", tree.reduce, "binomial tree to the root"),
            A("direct", direct.reduce, "root reduces every window", True),
        ]},
        "all_to_all": {a.name: a for a in [
            A("cma", single_copy.all_to_all, "read this rank's block of every peer's sendbuf", True, True),
            A("linear", linear.all_to_all, "all pairs at once"),
            A("direct", direct.all_to_all, "each rank copies its block out of every window", True),
        ]},
    }


ALGORITHMS: Dict[str, Dict[str, Algorithm]] = _table()
