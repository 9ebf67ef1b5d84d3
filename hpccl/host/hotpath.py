"""The compiled hot paths for host collectives: hpccl._hotpath among the ranks of one node (small calls
through shared-memory slots, large ones directly between the processes: HPCCL_HOT_DIRECT_SIZE), and
hpccl/csrc/_nethot.c (in the network engine's extension) across nodes when every rank is its own node.

Built by `pip install` with the package; where one was not built (no C compiler, no UCX headers) hpccl runs
the same calls in Python, slower, and `hpccl-info` says so. ``available()`` tells about the node's."""
from __future__ import annotations

from typing import Any, List, Optional

from .. import config
from ..ops import AVG, MAX, MIN, PROD, SUM

try:
    from .. import _hotpath
except ImportError:  # not compiled here: the Python algorithms serve every call
    _hotpath = None

#: ReduceOp (and its name) -> the C code; anything else is declined there and validated in Python
OPCODE = {SUM: 0, PROD: 1, MIN: 2, MAX: 3, AVG: 4, "sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}

#: collectives the hot path serves (one node; up to HPCCL_HOT_SIZE bytes per rank, HPCCL_HOT_REDUCE_SIZE for
#: all_reduce)
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "reduce", "all_to_all", "barrier")
#: collectives the path across nodes serves (up to HPCCL_NET_HOT_SIZE bytes per rank)
NET_COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce", "barrier")
#: the order of Hot.counts() and NetHot.counts() (the C kinds)
KINDS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier", "reduce", "all_to_all")


def counts(hot: Any, size: int) -> List[tuple]:
    """(collective, calls, bytes, seconds) of the calls the hot path completed, counted in C (no cost per
    call in Python); all_gather's bytes are its output's, as on the other paths."""
    return [(k, c, b * (size if k == "all_gather" else 1), t) for k, (c, b, t) in zip(KINDS, hot.counts()) if c]


def detail(hot: Any, size: int, latency: bool) -> List[tuple]:
    """The same counts by path for metrics: (path, collective, "host", "hot", calls, bytes, seconds, latency
    buckets or None); path "door" for the calls a front door handed over, "python" for validated ones."""
    return [("python" if v else "door", KINDS[k], "host", "hot", c, b * (size if KINDS[k] == "all_gather" else 1),
             t, h if latency else None) for k, v, c, b, t, h in hot.detail()]


def available() -> bool:
    return _hotpath is not None


def front_door_type() -> Optional[Any]:
    """hpccl._hotpath.FrontDoor (the C front door of host calls to either hot path), or None when not built."""
    return getattr(_hotpath, "FrontDoor", None)


def attach(shm: Any, rank: int, spin: int, single_copy: bool = False) -> Optional[Any]:
    """A hot-path object over this communicator's shared-memory segments, or None when the extension is
    not built or HPCCL_HOT_SIZE is 0. ``single_copy``: every rank may read its peers' memory (agreed), so
    broadcasts from HPCCL_HOT_DIRECT_SIZE bytes move directly between the processes, at any size."""
    if _hotpath is None:
        return None
    bases, pids, arrived_off, hot_ctr_off, slot_off, addr_off, done_off, cap = shm.hot_layout()
    if cap <= 0:
        return None
    reduce_cap = min(cap, max(0, config.get("HPCCL_HOT_REDUCE_SIZE")))
    direct = max(0, config.get("HPCCL_HOT_DIRECT_SIZE")) if single_copy else 0
    return _hotpath.Hot(bases, pids, arrived_off, hot_ctr_off, slot_off, addr_off, done_off, cap, reduce_cap,
                        direct, rank, spin)


def attach_net(transport: Any, spin: int) -> Optional[Any]:
    """The path across nodes over this network transport when it is the native engine (a NetHot), or None
    (another transport, or HPCCL_NET_HOT_SIZE is 0). Its failures raise the transport's HpcclErrors."""
    cap = config.get("HPCCL_NET_HOT_SIZE")
    if cap <= 0 or getattr(transport, "impl", "") != "engine":
        return None
    from ..transport.engine import net_hot
    return net_hot(transport, cap, spin)


def collectives(hot: Any) -> tuple:
    """The collectives a hot-path object serves."""
    return NET_COLLECTIVES if type(hot).__name__ == "NetHot" else COLLECTIVES
