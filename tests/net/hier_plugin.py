"""pytest plugin (-p hier_plugin) for the multi-node suites: lets HPCCL_ALGO / tuner.force pick 'hier'.

hpccl.tuning has no cost model for 'hier' yet, so Tuner.choose drops it even when forced; this gives it
an infinite modelled cost (never chosen by the model, but available when forced), so the shared suite
tests/mpi/mpi_collectives.py really runs the hierarchical algorithms across the namespaces. Remove once
tuning.MODELS has 'hier' entries."""
import math

from hpccl import tuning
from hpccl.algorithms import hier

for _coll in getattr(hier, "_SUPPORTED", ()):
    tuning.MODELS.get(_coll, {}).setdefault("hier", lambda P, N, n, s: math.inf)
