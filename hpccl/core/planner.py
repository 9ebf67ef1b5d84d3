"""The planner: one per communicator, it makes every algorithm choice for a call once and caches it per
(collective, memory kind, size bucket), from the one table (hpccl.algorithms: what each algorithm serves)
and the cost model (tuning.Tuner). A plan names its route and, where the route may decline a call, the
plan that runs instead. The hot path declines a dtype or size it does not take; zero-copy declines
unregistered buffers. Both decline the same way on every rank.

What replays a choice without asking again is the planner's too, and is dropped with the plans when a
choice is forced (force(), as HPCCL_ALGO would). That is the compiled hot path's front door (``front``:
collective -> hot path) and the GPU launch snapshots (``replays``: snapshot key -> algorithm, the
engine's ``drop``). Nothing here imports the Communicator."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ..algorithms import ALGORITHMS, CUDA, HOST, Algorithm, Layout, eligible

#: routes: the compiled hot path; a host schedule; hier over sub-communicators; a GPU kernel on one node;
#: a host schedule over device primitives on the network proxy; zero-copy kernels on registered buffers
HOT, SCHEDULE, HIER, KERNEL, PROXY, ZERO_COPY = "hot", "schedule", "hier", "kernel", "proxy", "zero_copy"
_REPLAYS_MAX = 2048
#: collectives with zero-copy kernels for registered buffers (hpccl/gpu/zero_copy.py)
ZERO_COPY_COLLS = frozenset(("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"))
#: collectives of blocks of any size the hot path runs on blocks padded to the largest (hpccl/core/vpad.py):
#: the hot path's collectives each can become, the first it serves taken
PADDED = {"gather": ("all_gather",), "scatter": ("broadcast",), "all_gather_v": ("all_gather",),
          "reduce_scatter_v": ("reduce_scatter", "all_reduce")}


class Plan(NamedTuple):
    """A call's route, its algorithm's name and table entry (None for hot and hier), and for a route that
    may decline (hot, zero_copy) the plan to run instead."""

    route: str
    algo: str
    spec: Optional[Algorithm]
    fallback: Optional["Plan"] = None


class Planner:
    """Every choice of one communicator: plan(), the front door and snapshots that replay plans, force()."""

    def __init__(self, tuner: Any, layout: Layout) -> None:
        self.tuner, self.layout = tuner, layout
        self.front: Dict[str, Any] = {}  # filled and emptied in place: the collectives read it per call
        self.replays: Dict[tuple, str] = {}
        self.hot: Any = None
        self.hot_serves: tuple = ()
        self.hot_colls: frozenset = frozenset()
        self.front_open = False  # the front door may take calls (no HPCCL_CHECK, dumps or trace)
        self.registered = False  # a buffer was registered (comm.register): device calls try zero-copy first
        self.on_drop: List[Callable[[], None]] = []  # owners of replays (the GPU engine's snapshots)
        self._plans: Dict[tuple, Plan] = {}
        self._eligible: Dict[tuple, List[str]] = {}
        self._closed = False

    # ----- what is available ---------------------------------------------------------------------------
    def modelled(self, coll: str, kind: str) -> List[str]:
        """The table's algorithms for ``coll`` on this layout: the ones the cost model chooses among."""
        names = self._eligible.get((coll, kind))
        if names is None:
            names = self._eligible[(coll, kind)] = eligible(coll, kind, self.layout)
        return names

    def algorithms(self, coll: str, kind: str) -> List[str]:
        """Every algorithm that can run ``coll`` on ``kind`` memory: the modelled ones and the hot path."""
        names = self.modelled(coll, kind)
        return names + [HOT] if kind == HOST and coll in self.hot_serves else names

    # ----- planning ------------------------------------------------------------------------------------
    def plan(self, coll: str, nbytes: int, kind: str) -> Plan:
        """The plan for a call of ``nbytes`` bytes on ``kind`` memory (cached per power-of-two bucket)."""
        key = (coll, kind, nbytes.bit_length())
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self._make(coll, nbytes, kind)
        return p

    def _make(self, coll: str, nbytes: int, kind: str) -> Plan:
        algo = self.tuner.choose(coll, nbytes, self.modelled(coll, kind), kind)
        spec = ALGORITHMS[coll].get(algo)
        if algo == HIER:
            p = Plan(HIER, algo, None)
        elif kind == HOST:
            p = Plan(SCHEDULE, algo, spec)
        else:
            p = Plan(KERNEL if spec is not None and spec.cuda_scope == "node" else PROXY, algo, spec)
        if kind == HOST and coll in self.hot_colls:
            return Plan(HOT, HOT, None, p)
        # across nodes the compiled all_gather takes rounds over the network where a gather's messages take one
        # step: from 3 ranks a gather goes by its schedule (docs/perf/host/vcolls_ab_split1_np4.txt)
        wide_gather = coll == "gather" and self.layout.nodes > 1 and self.tuner.n > 2
        if kind == HOST and not wide_gather and any(b in self.hot_colls for b in PADDED.get(coll, ())):
            forced = self.tuner.override.get(coll) or self.tuner.override.get("*")
            if forced != p.algo:  # unless HPCCL_ALGO pinned the schedule the table runs
                return Plan(HOT, "padded", None, p)
        if kind == CUDA and self.registered and coll in ZERO_COPY_COLLS:
            return Plan(ZERO_COPY, ZERO_COPY, None, p)
        return p

    def register(self) -> None:
        """A buffer was registered for zero-copy: device plans try it first from now on."""
        if not self.registered:
            self.registered = True
            self.drop()

    def snapshot(self, key: Any, algo: str) -> None:
        """A GPU launch snapshot was made under ``key`` for a call planned to ``algo``."""
        if key is not None:
            if len(self.replays) > _REPLAYS_MAX:
                self.replays.clear()
            self.replays[key] = algo

    # ----- forcing and dropping ------------------------------------------------------------------------
    def force(self, coll: str, algo: Optional[str]) -> None:
        """Pin ``coll`` (or '*': every collective) to ``algo`` as HPCCL_ALGO would; None: back to the model.
        Every plan and every replay of one goes, so the next call of each is planned anew."""
        if algo is None:
            self.tuner.override.pop(coll, None)
        else:
            self.tuner.override[coll] = algo
        self.drop()

    def drop(self) -> None:
        """Forget every plan and what replays them: the front door is rebuilt from the override, the
        GPU snapshots go (a snapshot is keyed by buffers, not algorithm: two ranks whose allocators reuse a
        pointer differently would otherwise replay different kernels in one call)."""
        self._plans.clear()
        self.replays.clear()
        for fn in self.on_drop:
            fn()
        self._refresh_hot()

    def attach_hot(self, hot: Any, serves: tuple, front_open: bool) -> None:
        """The communicator's compiled hot path, the collectives it can serve, and whether its front door
        may take calls before Python sees them."""
        self.hot, self.hot_serves, self.front_open = hot, serves, front_open
        self.drop()

    def _refresh_hot(self) -> None:
        if self.hot is None or self._closed:
            return
        ov = self.tuner.override
        self.hot_colls = frozenset(c for c in self.hot_serves if (ov.get(c) or ov.get("*")) in (None, HOT))
        self.front.clear()
        if self.front_open:
            self.front.update((c, self.hot) for c in self.hot_colls)

    def close(self) -> None:
        """The communicator is aborted or destroyed: nothing replays any more."""
        self._closed = True
        self.front.clear()
        self.hot_colls = frozenset()
        self._plans.clear()
