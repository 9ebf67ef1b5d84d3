"""The cost model: predicted time of each algorithm from latency/bandwidth terms; the cheapest wins.

One Tuner per communicator serves both memory kinds: host algorithms are priced on the communicator's
path ('shm', or the network's 'mpi'/'ucx'); GPU kernels on one node by KERNEL_MODELS ('cuda' path);
GPU network schedules on the device network path ('ucx_cuda': device memory across nodes on the native
engine's staged steps; over MPI, the 'mpi' terms with twice the latency for the proxy's hand-off); hier by
the sum of its node steps and its network step.
Terms per path (seconds, seconds per byte) were fitted to hpccl-perf sweeps with HPCCL_ALGO forced
(docs/PERFORMANCE.md, docs/NETWORK.md); HPCCL_TUNING_FILE replaces them and HPCCL_ALGO overrides the
choice."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterable, Optional, Tuple

from .. import config, log
from ..errors import HpcclInvalidArgument


@dataclass(frozen=True)
class Path:
    """alpha: fixed cost of one message step; beta: per byte moved; red: per byte reduced;
    bar: one window barrier."""

    alpha: float
    beta: float
    red: float
    bar: float


DEFAULTS: Dict[str, Path] = {
    "shm": Path(alpha=12e-6, beta=1 / 11e9, red=1 / 7e9, bar=4e-6),
    "mpi": Path(alpha=60e-6, beta=1 / 1.5e9, red=1 / 4e9, bar=60e-6),
    "ucx": Path(alpha=40e-6, beta=1 / 2e9, red=1 / 4e9, bar=40e-6),
    "cuda": Path(alpha=12e-6, beta=1 / 300e9, red=1 / 1500e9, bar=6e-6),
    # device memory between nodes over UCX (the native engine's staged steps; the name is kept for tuning files)
    "ucx_cuda": Path(alpha=60e-6, beta=1 / 3e9, red=1 / 300e9, bar=60e-6),
}

# GPU kernels over peer memory on one node: launch + flag round trips + bytes over the link (2x H200 NV18,
# docs/GPU.md); N as in MODELS (all_gather: bytes received, reduce_scatter: bytes sent).
LAUNCH, SYNC = 4e-6, 2.5e-6
ONESHOT_BW, TWOSHOT_BW, PUSH_BW = 324e9, 342e9, 345e9
KERNEL_MODELS: Dict[str, Dict[str, Callable[[float, int], float]]] = {
    "all_reduce": {
        "oneshot": lambda N, n: LAUNCH + SYNC + (n - 1) * N / ONESHOT_BW,
        "twoshot": lambda N, n: LAUNCH + 2 * SYNC + 2 * (n - 1) / n * N / TWOSHOT_BW,
    },
    "reduce": {"direct": lambda N, n: LAUNCH + SYNC + (n - 1) * N / ONESHOT_BW},
    "reduce_scatter": {"direct": lambda N, n: LAUNCH + SYNC + (n - 1) / n * N / ONESHOT_BW},
    "all_gather": {"direct": lambda N, n: LAUNCH + SYNC + (n - 1) / n * N / PUSH_BW},
    "broadcast": {"direct": lambda N, n: LAUNCH + SYNC + N / PUSH_BW},
    "all_to_all": {"direct": lambda N, n: LAUNCH + SYNC + (n - 1) / n * N / PUSH_BW},
}


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 0


def _rd_steps(n: int) -> int:
    pof2 = 1 << (n.bit_length() - 1)
    return _log2(pof2) + (2 if n > pof2 else 0)


def _dbtree(P: "Path", N: float, n: int, s: float) -> float:
    """2 phases x (depth + pieces) steps; each step moves one piece of each half (256 KiB pieces)."""
    pieces = max(1.0, N / 2 / (256 << 10))
    depth = math.ceil(math.log2(n + 1))
    piece = N / 2 / pieces
    return s * N * P.beta + 2 * (depth + pieces) * (_a(P, s) + s * 2 * piece * (2 * P.beta + P.red / 2))


# cma terms carry one more factor of s: on an oversubscribed node the kernel's cross-process copies
# measured slower than memcpy (docs/PERFORMANCE.md, algorithm sweeps at 4 ranks on 2 cores)


def _a(P: "Path", s: float) -> float:
    """A message step's fixed cost; on an oversubscribed node both partners must be scheduled (~s^2)."""
    return P.alpha * s * s


def _b(P: "Path", s: float) -> float:
    """A window barrier's fixed cost; all ranks of the node must be scheduled (~s^3, fitted at s=2)."""
    return P.bar * s * s * s


Model = Callable[[Path, float, int, float], float]

#: collective -> algorithm -> t(path, bytes, ranks, cpu_share)
MODELS: Dict[str, Dict[str, Model]] = {
    "all_reduce": {
        # a slot written by one core and reduced by another costs about one more copy
        "ring": lambda P, N, n, s: (n - 1) * (2 * _a(P, s) + s * N / n * (4 * P.beta + P.red)),
        "tree": lambda P, N, n, s: 2 * _log2(n) * (_a(P, s) + s * N * (P.beta + P.red / 2)),
        "rd": lambda P, N, n, s: _rd_steps(n) * (_a(P, s) + s * N * (2 * P.beta + P.red)),
        "dbtree": lambda P, N, n, s: _dbtree(P, N, n, s),
        "oneshot": lambda P, N, n, s: _b(P, s) + s * N * (P.beta + (n - 1) * P.red),
        "twoshot": lambda P, N, n, s: 2 * _b(P, s) + s * N * ((2 - 1 / n) * P.beta + (n - 1) / n * P.red),
        "cma": lambda P, N, n, s: 7 * _b(P, s) + s * s * N * (n - 1) / n * (2 * P.beta + P.red),
    },
    "all_gather": {  # N = bytes received (n x send)
        "ring": lambda P, N, n, s: (n - 1) * (_a(P, s) + s * N / n * 3 * P.beta) + s * N / n * P.beta,
        "direct": lambda P, N, n, s: _b(P, s) + s * N * (P.beta + P.beta / n),
        "cma": lambda P, N, n, s: 3 * _b(P, s) + s * s * N * P.beta,
    },
    "reduce_scatter": {  # N = bytes sent (n x recv)
        "ring": lambda P, N, n, s: (n - 1) * (_a(P, s) + s * N / n * (2 * P.beta + P.red)),
        "direct": lambda P, N, n, s: _b(P, s) + s * N * (P.beta + (n - 1) / n * P.red),
        "cma": lambda P, N, n, s: 3 * _b(P, s) + s * s * N * (n - 1) / n * (P.beta + P.red),
    },
    "broadcast": {
        "tree": lambda P, N, n, s: _log2(n) * (_a(P, s) + s * N * 2 * P.beta),
        "ring": lambda P, N, n, s: (n - 1 + max(1.0, N / (1 << 20))) * _a(P, s) + s * N * 2 * P.beta
        * (1 + (n - 1) / max(1.0, N / (1 << 20))),
        "direct": lambda P, N, n, s: _b(P, s) + s * N * 2 * P.beta,
        # readers copy straight from the root's buffer; oversubscribed, they measured 1.3-1.8x faster than
        # direct from 2 MiB at 4 ranks on 2 cores (docs/PERFORMANCE.md), so less than cma's usual s^2
        "cma": lambda P, N, n, s: 3 * _b(P, s) + s * (1 + s) / 2 * N * P.beta,
    },
    "reduce": {
        "tree": lambda P, N, n, s: _log2(n) * (_a(P, s) + s * N * (2 * P.beta + P.red)),
        "direct": lambda P, N, n, s: _b(P, s) + s * N * (P.beta + (n - 1) * P.red / n * 2),
        "cma": lambda P, N, n, s: 3 * _b(P, s) + s * s * N * (n - 1) * (P.beta + P.red),
    },
    "all_to_all": {
        "linear": lambda P, N, n, s: (n - 1) * _a(P, s) / 2 + s * N * 2 * P.beta,
        "direct": lambda P, N, n, s: _b(P, s) + s * N * 2 * P.beta,
        "cma": lambda P, N, n, s: 3 * _b(P, s) + s * (1 + s) / 2 * N * P.beta,  # as broadcast's
    },
    # blocks of any size: N = the bytes of every block together; the model prices even blocks. A rank posting
    # n-1 messages at once pays half a step each (as all_to_all's linear); a message's bytes cross the wire
    # once and are copied once on each side (2 beta); a tree rank forwards its subtree once more.
    "gather": {
        "direct": lambda P, N, n, s: _a(P, s) * n / 2 + s * N * (n - 1) / n * 2 * P.beta,
        "tree": lambda P, N, n, s: _log2(n) * _a(P, s) + s * N * (n - 1) / n * 3 * P.beta,
    },
    "scatter": {
        "direct": lambda P, N, n, s: _a(P, s) * n / 2 + s * N * (n - 1) / n * 2 * P.beta,
        "tree": lambda P, N, n, s: _log2(n) * _a(P, s) + s * N * (n - 1) / n * 3 * P.beta,
    },
    # all_gather_v direct: each rank's block to all others and n-1 blocks in, all posted at once; past a few
    # ranks the incoming messages contend (the ring's one neighbour each way does not)
    "all_gather_v": {
        "direct": lambda P, N, n, s: _a(P, s) * n / 2 + s * N * (n - 1) / n * P.beta * (2 + (n - 2) / 2),
        "ring": lambda P, N, n, s: (n - 1) * (_a(P, s) + s * N / n * 2 * P.beta) + s * N / n * P.beta,
    },
    "reduce_scatter_v": {
        "direct": lambda P, N, n, s: _a(P, s) * n / 2 + s * N * (n - 1) / n * (P.beta * (2 + (n - 2) / 2)
                                                                              + P.red),
        "ring": lambda P, N, n, s: (n - 1) * (_a(P, s) + s * N / n * (2 * P.beta + P.red)),
    },
}


def best_flat(coll: str, P: Optional[Path], nbytes: float, n: int, algos: Optional[Iterable[str]] = None,
              share: float = 1.0) -> Tuple[str, float]:
    """(algorithm, seconds) of the cheapest flat algorithm for ``coll`` on ``n`` ranks over path ``P``;
    P None: the GPU kernels of one node (KERNEL_MODELS)."""
    if n <= 1:
        return "-", 0.0
    if P is None:
        cand = {a: f(float(nbytes), n) for a, f in KERNEL_MODELS[coll].items()}
    else:
        cand = {a: f(P, float(nbytes), n, share) for a, f in MODELS[coll].items()
                if algos is None or a in algos}
    a = min(cand, key=cand.get)
    return a, cand[a]


#: schedules that run over point-to-point messages only (what a network step can use)
NET_ALGOS = ("ring", "tree", "rd", "dbtree", "linear")

HIER_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def hier_time(coll: str, nbytes: float, nodes: int, local: int, intra: Optional[Path], inter: Path, nics: int = 1,
              share: float = 1.0, intra_algos: Optional[Iterable[str]] = None,
              inter_algos: Optional[Iterable[str]] = None) -> Tuple[float, Dict[str, str]]:
    """Predicted seconds of algorithms/hier.py for ``coll`` and the sub-algorithms it would run: the sum
    of its sub-communicator collectives, each at its own cheapest algorithm on its own path. ``inter``
    is one NIC; the ``local`` concurrent inter-node collectives share a node's ``nics``; ``intra`` None
    prices the node steps as GPU kernels."""
    L, M = local, nodes
    net = replace(inter, beta=inter.beta * max(1.0, L / nics))
    if coll == "all_reduce":
        a1, t1 = best_flat("reduce_scatter", intra, nbytes, L, intra_algos, share)
        a2, t2 = best_flat("all_reduce", net, nbytes / L, M, inter_algos)
        a3, t3 = best_flat("all_gather", intra, nbytes, L, intra_algos, share)
        return t1 + t2 + t3, {"intra_reduce_scatter": a1, "inter_all_reduce": a2, "intra_all_gather": a3}
    if coll == "all_gather":  # nbytes: the whole gathered buffer
        a1, t1 = best_flat("all_gather", net, nbytes / L, M, inter_algos)
        a2, t2 = best_flat("all_gather", intra, nbytes, L, intra_algos, share)
        return t1 + t2 + share * nbytes * _copy_beta(intra), {"inter_all_gather": a1, "intra_all_gather": a2}
    if coll == "reduce_scatter":  # nbytes: the whole input
        a1, t1 = best_flat("reduce_scatter", intra, nbytes, L, intra_algos, share)
        a2, t2 = best_flat("reduce_scatter", net, nbytes / L, M, inter_algos)
        return share * nbytes * _copy_beta(intra) + t1 + t2, {"intra_reduce_scatter": a1,
                                                                "inter_reduce_scatter": a2}
    if coll == "broadcast":
        a1, t1 = best_flat("broadcast", inter, nbytes, M, inter_algos)
        a2, t2 = best_flat("broadcast", intra, nbytes, L, intra_algos, share)
        return t1 + t2, {"inter_broadcast": a1, "intra_broadcast": a2}
    if coll == "reduce":
        a1, t1 = best_flat("reduce", intra, nbytes, L, intra_algos, share)
        a2, t2 = best_flat("reduce", inter, nbytes, M, inter_algos)
        return t1 + t2, {"intra_reduce": a1, "inter_reduce": a2}
    raise KeyError(coll)


def _copy_beta(intra: Optional[Path]) -> float:
    """Seconds per byte of hier's local reordering copy (host memcpy, or device memory at ~1.5 TB/s)."""
    return intra.beta if intra is not None else 1 / 1500e9


def _load_paths() -> Dict[str, Path]:
    paths = dict(DEFAULTS)
    fname = config.get("HPCCL_TUNING_FILE")
    if fname:
        try:
            with open(fname) as f:
                data = json.load(f)
            for name, terms in data.items():
                paths[name] = replace(paths.get(name, DEFAULTS["shm"]), **terms)
        except (OSError, ValueError, TypeError) as exc:
            raise HpcclInvalidArgument("HPCCL_TUNING_FILE", f"cannot use {fname}: {exc}") from None
    return paths


def _parse_override(text: str) -> Dict[str, str]:
    """'ring' -> {'*': 'ring'}; 'all_reduce:ring,broadcast:tree' -> per collective."""
    out: Dict[str, str] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        coll, _, algo = item.rpartition(":")
        out[coll or "*"] = algo
    return out


class Tuner:
    """The cost model of one communicator: the algorithm it prices lowest per (collective, memory kind,
    size), or the one HPCCL_ALGO (``override``) pins; the planner (hpccl/core/planner.py) caches its answers."""

    def __init__(self, path: str, nranks: int, local_ranks: int, nodes: int = 1, intra: str = "shm") -> None:
        paths = _load_paths()
        self.path = paths[path]
        self.intra = paths[intra]
        self.gpu_net = paths["ucx_cuda"] if path != "mpi" else replace(paths["mpi"], alpha=paths["mpi"].alpha * 2)
        self.path_name = path
        self.n = nranks
        self.nodes, self.local = nodes, local_ranks
        cpus = os.cpu_count() or 1
        self.share = max(1.0, local_ranks / cpus)
        self.override = _parse_override(config.get("HPCCL_ALGO"))
        self._warned: set = set()

    def predict(self, coll: str, algo: str, nbytes: int, kind: str = "host") -> float:
        N = float(nbytes)
        if kind == "cuda":
            if algo == "hier":  # node steps as kernels, the network step over UCX with device memory
                return hier_time(coll, N, self.nodes, self.local, None, self.gpu_net,
                                 inter_algos=NET_ALGOS)[0]
            if self.nodes == 1:
                return KERNEL_MODELS[coll][algo](N, self.n)
            return MODELS[coll][algo](self.gpu_net, N, self.n, 1.0)
        if algo == "hier":
            return hier_time(coll, N, self.nodes, self.local, self.intra, self.path, share=self.share)[0]
        return MODELS[coll][algo](self.path, N, self.n, self.share)

    def choose(self, coll: str, nbytes: int, eligible: Iterable[str], kind: str = "host") -> str:
        names = list(eligible)
        forced = self.override.get(coll) or self.override.get("*")
        if forced:
            if forced in names:
                return forced
            if (coll, kind, forced) not in self._warned:
                self._warned.add((coll, kind, forced))
                log.warn("TUNING", "HPCCL_ALGO=%s is not available for %s on %s memory here (have %s); using "
                         "the model", forced, coll, kind, ",".join(names))
        # decide at the middle of the power-of-two bucket the size falls in
        probe = 3 << max(0, nbytes.bit_length() - 2) if nbytes > 1 else nbytes
        best = min(names, key=lambda a: self.predict(coll, a, probe, kind))
        log.trace("TUNING", "%s %d B %s on %d ranks over %s -> %s", coll, nbytes, kind, self.n, self.path_name,
                  best)
        return best


def simulate(coll: str, nbytes: int, nranks: int, path: str, algos: Optional[Iterable[str]] = None) -> Dict[str, float]:
    """Predicted seconds per algorithm for a configuration (used by the scaling tables)."""
    P = _load_paths()[path]
    return {a: f(P, float(nbytes), nranks, 1.0) for a, f in MODELS[coll].items()
            if algos is None or a in algos}
