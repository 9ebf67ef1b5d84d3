"""Cost model of the hierarchical collectives (hpccl/algorithms/hier.py), for the scaling simulation and
for timing 'hier' with hpccl-perf before hpccl.tuning models it.

hier.run composes sub-communicator collectives, so its time is the sum of theirs, each predicted by
hpccl.tuning's own per-algorithm models on its own path (the cheapest algorithm each time, as the tuner of
that sub-communicator would pick):

    all_reduce  L reduces of N/L bytes inside the node (to local rank l), an all_reduce of N/L bytes
                among the M nodes (all L inter-communicators run at once, L/NICs of them per NIC),
                then L broadcasts of N/L inside the node
    broadcast   broadcast of N among the nodes, then inside the node
    reduce      reduce of N inside the node, then among the nodes

    python bench/hier_model.py perf all_reduce -b 1K -e 16M -f 4 --algo hier,ring --compare mpi
        runs hpccl-perf with 'hier' made available to --algo / HPCCL_ALGO (run it under mpiexec)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpccl import tuning  # noqa: E402
from hpccl.tuning import MODELS, Path as CostPath  # noqa: E402

HIER = ("all_reduce", "broadcast", "reduce")


def best(coll: str, P: CostPath, nbytes: float, n: int, algos=None) -> Tuple[str, float]:
    """(algorithm, seconds) the flat model picks for ``coll`` on ``n`` ranks over path ``P``."""
    if n <= 1:
        return "-", 0.0
    cand = {a: f(P, float(nbytes), n, 1.0) for a, f in MODELS[coll].items() if algos is None or a in algos}
    a = min(cand, key=cand.get)
    return a, cand[a]


def hier_time(coll: str, nbytes: float, nodes: int, local: int, intra: CostPath, inter: CostPath,
              nics: int = 1, intra_algos=None, inter_algos=None) -> Tuple[float, Dict[str, str]]:
    """Predicted seconds of hier.run(coll) and the sub-algorithms it would use; ``inter`` is one NIC's
    path and a node has ``nics`` of them (the concurrent inter-node all_reduces share them)."""
    if coll == "all_reduce":
        part = nbytes / local
        ra, rt = best("reduce", intra, part, local, intra_algos)
        # the L inter-node all_reduces run concurrently: local/nics of them share each NIC
        inter_shared = CostPath(inter.alpha, inter.beta * max(1.0, local / nics), inter.red, inter.bar)
        xa, xt = best("all_reduce", inter_shared, part, nodes, inter_algos)
        ba, bt = best("broadcast", intra, part, local, intra_algos)
        return local * rt + xt + local * bt, {"intra_reduce": ra, "inter_all_reduce": xa, "intra_broadcast": ba}
    if coll == "broadcast":
        xa, xt = best("broadcast", inter, nbytes, nodes, inter_algos)
        ba, bt = best("broadcast", intra, nbytes, local, intra_algos)
        return xt + bt, {"inter_broadcast": xa, "intra_broadcast": ba}
    if coll == "reduce":
        ra, rt = best("reduce", intra, nbytes, local, intra_algos)
        xa, xt = best("reduce", inter, nbytes, nodes, inter_algos)
        return rt + xt, {"intra_reduce": ra, "inter_reduce": xa}
    raise ValueError(coll)


def make_hier_available(models: Optional[dict] = None) -> None:
    """Give 'hier' an infinite modelled cost: never chosen by the model, but selectable when forced."""
    models = MODELS if models is None else models
    for coll in HIER:
        models[coll].setdefault("hier", lambda P, N, n, s: math.inf)


def main(argv) -> None:
    if argv[:1] == ["perf"]:
        make_hier_available()
        from hpccl.cli import perf
        sys.exit(perf.main(argv[1:]))
    sys.exit(__doc__)


if __name__ == "__main__":
    assert tuning  # keep the import: the patch targets this module's tables
    main(sys.argv[1:])
