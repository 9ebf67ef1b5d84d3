"""Helpers shared by the GPU tests: per-rank data, host references, device <-> host for CuPy and torch."""
from __future__ import annotations

import numpy as np

from hpccl.ops import AVG, MAX, MIN, PROD, SUM, bfloat16

FLOATS = ("float16", "bfloat16", "float32", "float64")


def np_dtype(name):
    return bfloat16 if name == "bfloat16" else np.dtype(name)


def rank_data(name, count, rank, seed, op):
    """Deterministic data of one rank (any rank can regenerate any other's)."""
    rng = np.random.default_rng([seed, rank, count])
    dt = np_dtype(name)
    if name in FLOATS:
        x = rng.uniform(0.5, 1.5, count) if op is PROD else rng.uniform(-1.0, 1.0, count)
        return x.astype(dt)
    if op is PROD:
        return rng.integers(1, 4, count).astype(dt)
    if dt.kind == "u":
        return rng.integers(0, 100, count).astype(dt)
    return rng.integers(-50, 50, count).astype(dt)


def reference(name, op, arrays):
    dt = np_dtype(name)
    if name in FLOATS:
        acc = arrays[0].astype(np.float64)
        for a in arrays[1:]:
            b = a.astype(np.float64)
            acc = {SUM: np.add, AVG: np.add, PROD: np.multiply, MIN: np.minimum, MAX: np.maximum}[op](acc, b)
        if op is AVG:
            acc = acc / len(arrays)
        return acc.astype(dt)
    acc = arrays[0].copy()
    uf = {SUM: np.add, PROD: np.multiply, MIN: np.minimum, MAX: np.maximum}[op]
    for a in arrays[1:]:
        acc = uf(acc, a)
    return acc


def assert_close(name, got, want, what="", hops=1):
    """``hops``: how many times a partial result was rounded to the dtype on its way (a ring across n
    nodes rounds n-1 times, each within half an ulp of the partial sum, where a kernel rounds once):
    the half-precision tolerances grow with it beyond 3."""
    if name in FLOATS:
        tol = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}[name]
        if name in ("float16", "bfloat16"):
            tol *= max(1.0, hops / 3)
        g, w = got.astype(np.float64), want.astype(np.float64)
        bad = ~(np.abs(g - w) <= tol * np.maximum(1.0, np.abs(w)))
        assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} wrong, first at {np.argmax(bad)}: " \
                              f"got {g[np.argmax(bad)]} want {w[np.argmax(bad)]}"
    else:
        bad = got != want
        assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} wrong, first at {np.argmax(bad)}: " \
                              f"got {got[np.argmax(bad)]} want {want[np.argmax(bad)]}"


def have_torch():
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def to_dev(arr, device, lib="cupy"):
    """Host numpy -> device array (bfloat16 always through torch, which has the dtype)."""
    if lib == "torch" or arr.dtype == bfloat16:
        import torch
        if arr.dtype == bfloat16:
            t = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(arr.copy())
        return t.to(f"cuda:{device}")
    import cupy
    with cupy.cuda.Device(device):
        return cupy.asarray(arr)


def to_host(x):
    if type(x).__module__.startswith("torch"):
        import torch
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).cpu().numpy().view(bfloat16)
        return x.cpu().numpy()
    import cupy
    return cupy.asnumpy(x)


def poison(x):
    """Fill an output with a recognisable wrong value."""
    if type(x).__module__.startswith("torch"):
        x.view(-1).view(__import__("torch").uint8).fill_(0xA5)
    else:
        x.view(np.uint8).fill(0xA5)


def end_together(comm):
    """After a test that made a communicator fail on purpose: every rank gets here, then frees it."""
    comm.mpi_comm.Barrier()
    try:
        comm.destroy()
    except Exception:  # noqa: BLE001 - the communicator may be aborted
        pass
