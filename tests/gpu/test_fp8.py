"""float8 on GPU buffers: the widening and rounding kernels against ml_dtypes bit for bit, reductions of CuPy
1-byte words told dtype= and of torch float8 tensors against the float64 reference rounded once (every op,
in and out of place), data movement of the bytes, a captured CUDA graph replayed, and the errors.

Collective: run under MPI (`mpirun -n 2 python -m pytest tests/gpu/test_fp8.py -x -q`), one node or emulated
nodes (HPCCL_NODE_ID=split:K); skips without a GPU (tests/gpu/conftest.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from hpccl import HpcclInvalidArgument
from hpccl.ops import AVG, MAX, MIN, PROD, SUM, ml_dtype

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mpi"))
from mpi_fp8 import codes, reference, same  # noqa: E402 - the host suite's inputs and references

NAMES = ("float8_e4m3fn", "float8_e5m2")
OPS = (SUM, PROD, MIN, MAX, AVG)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def world():
    import cupy
    import hpccl
    from hpccl.gpu.device import rank_device
    comm = hpccl.Communicator()
    dev = rank_device(comm.local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(dev).use()
    try:
        import torch
        torch.cuda.set_device(dev)
    except ImportError:
        pass
    yield comm, dev
    comm.synchronize()
    comm.destroy()


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.mark.parametrize("name", NAMES)
def test_kernels_match_ml_dtypes(world, name):
    """hp_fp8_widen on all 256 codes and hp_fp8_narrow on float32 patterns around every rounding boundary and
    the specials (NaN, infinities, overflow, subnormals) equal ml_dtypes' conversions bit for bit."""
    import cupy
    comm, _ = world
    mem = comm._device().mem
    dt = ml_dtype(name)
    st = cupy.cuda.get_current_stream().ptr
    b = cupy.arange(256, dtype=cupy.uint8)
    w = cupy.empty(256, cupy.float32)
    mem.fp8_convert(w, b, name, True, st)
    want = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32).view(np.uint32)
    assert np.array_equal(cupy.asnumpy(w).view(np.uint32), want)
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1FFF, 0x2000, 0x2001, 0xFFFE], np.uint32)
    x = np.concatenate([(hi[:, None] | lows[None, :]).ravel(),
                        np.random.default_rng(1).integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)])
    out = cupy.empty(x.size, cupy.uint8)
    mem.fp8_convert(out, cupy.asarray(x.view(np.float32)), name, False, st)
    got, ref = cupy.asnumpy(out), x.view(np.float32).astype(dt).view(np.uint8)
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, [(hex(x[i]), hex(got[i]), hex(ref[i])) for i in bad[:8]]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("coll", ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v"])
def test_reductions_of_cupy_words(world, name, coll):
    """CuPy uint8 arrays told dtype=: every op, in place and not, odd counts; the float64 reference rounded
    once."""
    import cupy
    comm, _ = world
    n, r = comm.size, comm.rank
    dt = ml_dtype(name)
    for op in OPS:
        for count, inplace in ((1, False), (1001, True), (70001, False)):
            seed = [NAMES.index(name), len(coll), OPS.index(op), count]  # the same on every rank
            counts = [count + q for q in range(n)]
            total = {"reduce_scatter": count * n, "reduce_scatter_v": sum(counts)}.get(coll, count)
            ins = [codes(np.random.default_rng([*seed, q]), name, op, total) for q in range(n)]
            want = reference(ins, op, dt)
            x = cupy.asarray(ins[r])
            if coll == "all_reduce":
                out = x if inplace else cupy.zeros(count, cupy.uint8)
                comm.all_reduce(x, None if inplace else out, op=op, dtype=name)
            elif coll == "reduce":
                out = x if inplace else cupy.zeros(count, cupy.uint8)
                comm.reduce(x, None if inplace else out, root=n - 1, op=op, dtype=name)
                if r != n - 1:
                    continue
            elif coll == "reduce_scatter":
                out = cupy.zeros(count, cupy.uint8)
                comm.reduce_scatter(x, out, op=op, dtype=name)
                want = want[r * count:(r + 1) * count]
            else:
                out = cupy.zeros(counts[r], cupy.uint8)
                comm.reduce_scatter_v(x, out, counts, op=op, dtype=name)
                off = sum(counts[:r])
                want = want[off:off + counts[r]]
            assert same(cupy.asnumpy(out), want, dt, op), (coll, name, op, count, inplace)
    comm.synchronize()


@pytest.mark.parametrize("name", NAMES)
def test_torch_float8_tensors(world, name):
    """torch float8 CUDA tensors need no dtype=: all_reduce (every op), all_gather_into_tensor's layout
    (all_gather), broadcast and all_to_all move their bytes unchanged."""
    torch = _torch()
    comm, dev = world
    n, r = comm.size, comm.rank
    dt, tdt = ml_dtype(name), getattr(torch, name)
    for op in OPS:
        ins = [codes(np.random.default_rng([17, q, OPS.index(op)]), name, op, 4099) for q in range(n)]
        t = torch.from_numpy(ins[r].copy()).to(f"cuda:{dev}").view(tdt)
        comm.all_reduce(t, op=op)
        assert same(t.view(torch.uint8).cpu().numpy(), reference(ins, op, dt), dt, op), (name, op)
    ins = [np.random.default_rng([23, q]).integers(0, 256, 6 * n, dtype=np.uint8) for q in range(n)]
    x = torch.from_numpy(ins[r].copy()).to(f"cuda:{dev}").view(tdt)
    g = comm.all_gather(x[:6], torch.empty(6 * n, dtype=tdt, device=f"cuda:{dev}"))
    assert np.array_equal(g.view(torch.uint8).cpu().numpy(), np.concatenate([a[:6] for a in ins]))
    b = comm.broadcast(x[:6].clone(), root=0)
    assert np.array_equal(b.view(torch.uint8).cpu().numpy(), ins[0][:6])
    a2a = comm.all_to_all(x, torch.empty(6 * n, dtype=tdt, device=f"cuda:{dev}"))
    assert np.array_equal(a2a.view(torch.uint8).cpu().numpy(), np.concatenate([a[6 * r:6 * r + 6] for a in ins]))
    comm.synchronize()


def test_captured_graph_replays(world):
    """A float8 all_reduce captured in a CUDA graph (temporaries kept for the graph) gives each replay's
    result for the inputs of that replay."""
    import cupy
    comm, _ = world
    if comm.num_nodes > 1 and not comm._net_capturable():
        pytest.skip("this layout's GPU network steps cannot be captured here")
    n, r = comm.size, comm.rank
    name, dt = "float8_e4m3fn", ml_dtype("float8_e4m3fn")
    x, out = cupy.zeros(2048, cupy.uint8), cupy.zeros(2048, cupy.uint8)
    s = cupy.cuda.Stream(non_blocking=True)
    comm.all_reduce(x, out, dtype=name, stream=s)  # first call outside the capture: kernels loaded
    s.synchronize()
    with s:
        s.begin_capture()
        comm.all_reduce(x, out, dtype=name, stream=s)
        graph = s.end_capture()
    for rep in range(2):
        ins = [codes(np.random.default_rng([31, q, rep]), name, SUM, 2048) for q in range(n)]
        x.set(ins[r], stream=s)
        graph.launch(s)
        s.synchronize()
        assert same(cupy.asnumpy(out), reference(ins, SUM, dt), dt), rep


def test_errors_name_the_argument(world):
    """A float8 dtype= for a buffer that is no 1-byte words, or one that contradicts a torch tensor's own."""
    import cupy
    comm, dev = world
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.all_reduce(cupy.zeros(4, cupy.float32), dtype="float8_e4m3fn")
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.all_reduce(cupy.zeros(4, cupy.uint8), dtype="int8")
    try:
        import torch
    except ImportError:
        return
    t = torch.zeros(4, dtype=torch.float8_e5m2, device=f"cuda:{dev}")
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.all_reduce(t, dtype="float8_e4m3fn")
