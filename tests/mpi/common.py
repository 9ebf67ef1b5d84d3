"""Helpers for suites that run inside every rank: inputs every rank can regenerate, and references."""
from __future__ import annotations

from typing import List

import numpy as np

import hpccl
from hpccl import config
from hpccl.host import hotpath
from hpccl.algorithms import ALGORITHMS, hier
from hpccl.ops import AVG, DTYPES, FLOATING, FP8_NAMES, MAX, MIN, PROD, SUM, ReduceOp

# the float8 types have their own suite (mpi_fp8.py: random cases against a float64 reference, every algorithm)
ALL_DTYPES = [DTYPES[name] for name in DTYPES if name not in FP8_NAMES]
ALL_OPS = [SUM, PROD, MIN, MAX, AVG]


def data(count: int, dtype: np.dtype, rank: int, salt: int = 0, op: ReduceOp = SUM) -> np.ndarray:
    """Small integers, exact in every dtype and under sums/products of up to 4 ranks."""
    rng = np.random.default_rng(1000 * rank + salt)
    if op is PROD:
        v = rng.integers(1, 3, count)
    elif dtype.kind == "i" and op in (MIN, MAX):
        v = rng.integers(-20, 20, count)
    else:
        v = rng.integers(0, 20, count)
    return v.astype(dtype)


def reduce_ref(inputs: List[np.ndarray], op: ReduceOp) -> np.ndarray:
    dtype = inputs[0].dtype
    acc = inputs[0].astype(np.float64 if dtype in FLOATING else dtype)
    for x in inputs[1:]:
        y = x.astype(acc.dtype)
        acc = {SUM: np.add, AVG: np.add, PROD: np.multiply, MIN: np.minimum, MAX: np.maximum}[op](acc, y)
    if op is AVG:
        acc = acc / len(inputs)
    return acc.astype(dtype)


def close(got: np.ndarray, want: np.ndarray, op: ReduceOp) -> bool:
    if op is AVG:
        return np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=1e-2)
    return np.array_equal(got.view(np.uint8), want.view(np.uint8))


def algorithms(comm: hpccl.Communicator, coll: str) -> List[str]:
    """Every algorithm this communicator can run for coll, checked against the table itself."""
    names = comm.algorithms(coll)
    assert set(names) - {"hier", "hot"} <= set(ALGORITHMS[coll])
    # the compiled hot path serves one node's shared memory wherever it was built (always in CI), and calls
    # across nodes when every rank is its own node and the native engine is the network (always in CI)
    node_hot = (coll in hotpath.COLLECTIVES and comm.num_nodes == 1 and comm.local_size > 1
                and not comm._force_mpi and config.get("HPCCL_HOT_SIZE") > 0)
    net_hot = (coll in hotpath.NET_COLLECTIVES and comm.num_nodes == comm.size > 1
               and [getattr(t, "impl", "") for t in comm._transports] == ["engine"]
               and config.get("HPCCL_NET_HOT_SIZE") > 0)
    assert ("hot" in names) == (node_hot or net_hot), names
    assert ("hier" in names) == (comm.num_nodes > 1 and hier.fits(coll, comm.layout))
    return names


def valid_ops(dtype: np.dtype) -> List[ReduceOp]:
    return [op for op in ALL_OPS if op is not AVG or dtype in FLOATING]
