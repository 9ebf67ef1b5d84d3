"""Single-process checks of the pieces: config registry, ops, node map, cost model, perf workloads."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hpccl import config
from hpccl.algorithms import ALGORITHMS
from hpccl.algorithms.parts import offsets
from hpccl.cli.workloads import expected, fill, workload, wrong
from hpccl.errors import HpcclInvalidArgument
from hpccl.ops import AVG, DTYPES, SUM, as_op, check_op_dtype
from hpccl.topology.nodes import detect_nodes, node_name
from hpccl.core.tuning import MODELS, Tuner


def test_config_parses_sizes_and_rejects_garbage(monkeypatch):
    monkeypatch.setenv("HPCCL_SHM_SLOT_SIZE", "64K")
    assert config.get("HPCCL_SHM_SLOT_SIZE") == 65536
    monkeypatch.setenv("HPCCL_SHM_DIRECT_SIZE", "2MiB")
    assert config.get("HPCCL_SHM_DIRECT_SIZE") == 2 << 20
    monkeypatch.setenv("HPCCL_TIMEOUT", "soon")
    with pytest.raises(HpcclInvalidArgument, match="HPCCL_TIMEOUT"):
        config.get("HPCCL_TIMEOUT")
    monkeypatch.setenv("HPCCL_DEBUG", "loud")
    with pytest.raises(HpcclInvalidArgument, match="HPCCL_DEBUG"):
        config.get("HPCCL_DEBUG")


def test_wireup_deadline_kept_between_floor_and_cap(monkeypatch):
    # a call timeout of 0.2 s (set by failure tests) must not fail a first UCX contact on a loaded node
    from hpccl.transport.ucx_config import wireup_limit
    for value, want in (("0.2", 10.0), ("30", 30.0), ("300", 60.0)):
        monkeypatch.setenv("HPCCL_TIMEOUT", value)
        assert wireup_limit() == want


def test_every_param_documented_and_sourced(monkeypatch):
    monkeypatch.setenv("HPCCL_SPIN", "7")
    rows = {name: (value, source, doc) for name, value, source, doc in config.describe()}
    assert rows["HPCCL_SPIN"][:2] == (7, "env")
    assert rows["HPCCL_TIMEOUT"][1] == "default"
    assert all(doc and name.startswith("HPCCL_") for name, (_, _, doc) in rows.items())


def test_ops_and_dtypes():
    assert as_op("MAX").value == "max"
    with pytest.raises(HpcclInvalidArgument):
        as_op(3)
    check_op_dtype(AVG, DTYPES["bfloat16"])
    with pytest.raises(HpcclInvalidArgument):
        check_op_dtype(AVG, DTYPES["uint8"])
    assert len(DTYPES) == 12


def test_ml_dtypes_is_imported_only_for_bfloat16():
    """ml_dtypes 0.7 takes about a second to import, which every rank paid at start: a job that never
    touches bfloat16 (including its calls' checks and errors) never imports it; hpccl.bfloat16 still works."""
    code = ("import sys, numpy as np, hpccl\n"
            "from hpccl.errors import HpcclInvalidArgument\n"
            "c = hpccl.init(); x = np.arange(8, dtype=np.float32); c.all_reduce(x); c.all_gather(x)\n"
            "assert sorted(hpccl.DTYPES)[0] == 'bfloat16' and 'bfloat16' in hpccl.DTYPES\n"
            "try:\n    c.all_reduce(np.zeros(2, np.complex64))\nexcept HpcclInvalidArgument as e:\n"
            "    assert 'bfloat16' in str(e)\n"
            "before = 'ml_dtypes' in sys.modules\n"
            "y = np.full(4, 3, dtype=hpccl.bfloat16); c.all_reduce(y, op='avg')\n"
            "print(before, 'ml_dtypes' in sys.modules, str(y.dtype), float(y[0])); c.destroy()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "bfloat16", "3.0"]


def test_offsets_cover_exactly():
    for count in (0, 1, 7, 1001):
        for n in (1, 2, 3, 4):
            off = offsets(count, n)
            assert off[0] == 0 and off[-1] == count and all(b >= a for a, b in zip(off, off[1:]))
            assert max(b - a for a, b in zip(off, off[1:])) - min(b - a for a, b in zip(off, off[1:])) <= 1


def test_node_map(monkeypatch):
    m = detect_nodes(["b", "a", "b", "a"])
    assert m.num_nodes == 2 and m.ranks_on(0) == [0, 2] and m.local_rank(3) == 1 and m.leaders() == [0, 1]
    monkeypatch.setenv("HPCCL_NODE_ID", "split:2")
    assert [node_name(r) for r in range(4)] == ["node0", "node0", "node1", "node1"]
    assert node_name(0, "x") == "x"


def test_cost_model_shapes():
    t = Tuner("shm", 4, 4)
    # latency-bound: a one-pass window algorithm beats the 6-step ring at 8 bytes
    assert t.choose("all_reduce", 8, ["ring", "oneshot", "twoshot", "tree", "rd", "cma"]) in ("oneshot", "twoshot")
    # bandwidth-bound at 256 MiB: never the whole-buffer tree or recursive doubling
    assert t.choose("all_reduce", 256 << 20, ["ring", "tree", "rd"]) == "ring"
    assert set(MODELS) == set(ALGORITHMS)
    for coll, algos in ALGORITHMS.items():
        assert set(algos) <= set(MODELS[coll]), coll


def test_override(monkeypatch):
    monkeypatch.setenv("HPCCL_ALGO", "all_reduce:tree,broadcast:ring")
    t = Tuner("shm", 3, 3)
    assert t.choose("all_reduce", 1 << 20, ["ring", "tree"]) == "tree"
    assert t.choose("broadcast", 8, ["tree", "ring", "direct"]) == "ring"
    t.override.pop("all_reduce")
    assert t.choose("all_reduce", 256 << 20, ["ring", "tree"]) == "ring"


def test_workload_reference_and_wrong():
    wl = workload("reduce_scatter", 1000, 4, 3)
    assert wl.count % 3 == 0 and wl.recv_count == wl.count // 3 and wl.busbw_factor == pytest.approx(2 / 3)
    dt = np.dtype(np.float32)
    want = expected(wl, dt, SUM, 3, 1, 0)
    full = sum(fill(wl.count, dt, q, SUM).astype(np.float64) for q in range(3)).astype(dt)
    assert np.array_equal(want, full[wl.recv_count:2 * wl.recv_count])
    got = want.copy()
    assert wrong(got, want, SUM) == 0
    got[3] += 1
    assert wrong(got, want, SUM) == 1


def test_the_site_documents_every_variable():
    """The site's configuration page (docs/conf.py renders it from the registry) lists every variable with its
    meaning; the README points there instead of keeping a second table."""
    import importlib.util
    import tempfile
    from pathlib import Path
    docs = Path(__file__).resolve().parent.parent / "docs"
    spec = importlib.util.spec_from_file_location("hpccl_docs_conf", docs / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    with tempfile.TemporaryDirectory() as tmp:
        conf.HERE = Path(tmp)
        conf._config_table(None)
        table = (Path(tmp) / "_generated" / "config.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line.split("|")[3].strip() for line in table.splitlines()
            if line.startswith("| `HPCCL_")}
    assert sorted(rows) == sorted(config.PARAMS)
    assert [name for name, meaning in rows.items() if len(meaning) < 20] == []


def test_hier_is_modelled_on_multi_node_communicators():
    from hpccl.core.tuning import HIER_COLLECTIVES, hier_time, DEFAULTS
    t = Tuner("mpi", 8, 4, nodes=2)
    for coll in HIER_COLLECTIVES:
        flat = [a for a in ALGORITHMS[coll] if not ALGORITHMS[coll][a].needs_window]
        pick = t.choose(coll, 64 << 20, flat + ["hier"])  # the candidate the model prices lowest
        assert t.predict(coll, pick, 64 << 20) == min(t.predict(coll, a, 64 << 20) for a in flat + ["hier"])
        assert 0 < t.predict(coll, "hier", 1 << 20) < float("inf")
    # slow network, fast node: the hierarchy must win for large all_reduce
    slow = DEFAULTS["mpi"].__class__(alpha=50e-6, beta=1 / 1e9, red=1 / 4e9, bar=50e-6)
    hier_t, subs = hier_time("all_reduce", 256 << 20, 2, 8, DEFAULTS["shm"], slow)
    from hpccl.core.tuning import best_flat
    assert hier_t < best_flat("all_reduce", slow, 256 << 20, 16, ["ring", "tree", "rd", "dbtree"])[1]
    assert set(subs) == {"intra_reduce_scatter", "inter_all_reduce", "intra_all_gather"}


@pytest.mark.parametrize("sms", [8, 24, 108, 132])
def test_gpu_kernels_sized_to_be_resident_together(sms):
    """Every rank sharing a GPU can have all its blocks resident at once, for any HPCCL_CUDA_BLOCKS: one
    block per SM per rank for collectives, and a p2p kernel (one send and one receive per peer) too."""
    from hpccl.gpu.cuda_comm import P2P_BLOCKS, block_cap, p2p_blocks
    from hpccl.kernels import MAX_BLOCKS
    for share in range(1, 9):
        cap = block_cap(sms, share)
        assert cap >= 1 and min(cap, MAX_BLOCKS) * share <= sms
        for n in range(share, 9):
            per = p2p_blocks(cap, n)
            assert 1 <= per <= P2P_BLOCKS
            assert 2 * (n - 1) * per * share <= max(sms, 2 * (n - 1) * share)
    assert block_cap(132, 1) >= MAX_BLOCKS and block_cap(132, 2) >= MAX_BLOCKS  # one or two ranks: as before
    assert block_cap(132, 4) == 33 and block_cap(132, 8) == 16


def test_mpi_leftovers_kept_while_a_live_process_maps_them():
    """The per-test /dev/shm clean-up (tests/conftest.py) removes new MPI segments only once no other process
    uses them: a segment another test run's running MPI job (or a rank still exiting) maps stays, and is
    removed by a later look once that process has ended."""
    import subprocess
    import sys

    import mpirun
    name = f"mpich_shm_hpccl_test_{os.getpid()}"
    before = mpirun.shm_snapshot()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import mmap, os, sys
fd = os.open('/dev/shm/{name}', os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
os.close(fd)
print('mapped', flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert name in mpirun.shm_in_use([name])
        busy: set = set()
        assert name not in mpirun.remove_mpi_leftovers(before, busy) and name in busy
        assert mpirun.remove_unused([name]) == []
        assert os.path.exists(f"/dev/shm/{name}")
    finally:
        holder.communicate("", timeout=30)
    assert mpirun.shm_in_use([name]) == set()
    assert mpirun.remove_unused([name]) == [name]  # what the clean-up does once the holder has gone
    assert not os.path.exists(f"/dev/shm/{name}")


def test_device_buffers_name_bfloat16_from_torch_and_the_array_interface(monkeypatch):
    """GPU buffers' dtypes without a GPU: a CUDA tensor (a stand-in of torch's type, real torch dtypes) and
    a __cuda_array_interface__ of 2-byte voids are bfloat16, its flat uint16 view reads back as bfloat16,
    float32 stays float32 and an unsupported dtype is refused naming the argument."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the test extra installs it)")
    import types

    from hpccl.memory import cuda

    def tensor(dt):
        t = types.SimpleNamespace(is_cuda=True, dtype=dt, is_contiguous=lambda: True, data_ptr=lambda: 4096,
                                  numel=lambda: 8, device=types.SimpleNamespace(index=0))
        return type("Tensor", (), {"__module__": "torch", "__getattr__": lambda s, k: getattr(t, k)})()

    b = cuda.device_view(tensor(torch.bfloat16), "tensor")
    assert b.dtname == "bfloat16" and b.itemsize == 2 and b.nbytes == 16
    assert cuda.device_view(tensor(torch.float32), "tensor").dtname == "float32"
    with pytest.raises(HpcclInvalidArgument, match="tensor"):
        cuda.device_view(tensor(torch.complex64), "tensor")
    cai = type("Cai", (), {"__cuda_array_interface__": {"typestr": "<V2", "shape": (4,), "data": (4096, False),
                                                        "version": 3}})()
    monkeypatch.setattr(cuda, "_pointer_device", lambda ptr: 0)  # cupy's pointer query, absent here
    assert cuda.device_view(cai, "x").dtname == "bfloat16"
    assert cuda.DeviceMemory.dtype(np.zeros(2, np.uint16)) == DTYPES["bfloat16"]


def test_cupy_streams_are_made_without_the_deprecated_external_stream(monkeypatch):
    """CuPy's stream over a caller's handle is made with Stream.from_external where CuPy has it (its
    ExternalStream warns at every use from CuPy 14), with ExternalStream on older CuPy; a stream of the CUDA
    stream protocol (``__cuda_stream__``) is taken as a handle, a malformed one refused naming the argument.
    Stand-in cupy modules, no GPU."""
    import sys
    import types

    from hpccl.memory import cuda

    made = []

    class Stream:
        @classmethod
        def from_external(cls, obj):
            made.append(("from_external", obj.__cuda_stream__()))
            return cls()

    def external(ptr):
        made.append(("ExternalStream", ptr))
        return Stream()

    new = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=Stream, ExternalStream=external))
    old = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=type("Stream", (), {}), ExternalStream=external))
    monkeypatch.setitem(sys.modules, "cupy", new)
    assert isinstance(cuda.cupy_stream(0x5000), Stream)
    monkeypatch.setitem(sys.modules, "cupy", old)
    cuda.cupy_stream(0x6000)
    assert made == [("from_external", (0, 0x5000)), ("ExternalStream", 0x6000)]

    proto = type("CoreStream", (), {"__cuda_stream__": lambda self: (0, 0x7000)})()
    assert cuda.stream_handle(proto, None) == 0x7000
    bad = type("BadStream", (), {"__cuda_stream__": lambda self: (1, 0x7000)})()
    with pytest.raises(HpcclInvalidArgument, match="stream"):
        cuda.stream_handle(bad, None)

    # a call's stream argument (DeviceMemory.stream): the protocol's handle, its GPU asked of the driver
    from hpccl.kernels import Driver
    on = {0x7000: 0, 0x8000: 1}
    monkeypatch.setattr(Driver, "_inst", types.SimpleNamespace(capturing=lambda h: False,
                                                               stream_device=lambda h: on[h]))
    mem = object.__new__(cuda.DeviceMemory)
    mem.device = 0
    assert mem.stream(proto, None) == 0x7000
    other = type("CoreStream", (), {"__cuda_stream__": lambda self: (0, 0x8000)})()
    with pytest.raises(HpcclInvalidArgument, match="stream.*GPU 1"):
        mem.stream(other, None)
    with pytest.raises(HpcclInvalidArgument, match="stream"):
        mem.stream(bad, None)
    with pytest.raises(HpcclInvalidArgument, match="stream.*not a CUDA stream"):
        mem.stream(object(), None)
    cupy_like = types.SimpleNamespace(ptr=0x9000, device_id=0)  # a CuPy stream says its GPU: no driver call
    assert mem.stream(cupy_like, None) == 0x9000


def test_kernels_load_makes_the_named_dtypes_modules_now(monkeypatch):
    """Kernels.load compiles the dtype-free module and each named dtype's (so a job with a short HPCCL_TIMEOUT
    pays NVRTC before its first call) and refuses a name that is not a dtype, naming the argument, before it
    compiles anything. The compile itself is a stand-in (no GPU here)."""
    from hpccl.kernels import DTYPE_IDS, Kernels

    k = Kernels(0)
    made = []
    monkeypatch.setattr(k, "_module", made.append)
    k.load(("float32", "int64"))
    assert made == [None, DTYPE_IDS["float32"], DTYPE_IDS["int64"]]
    made.clear()
    with pytest.raises(HpcclInvalidArgument, match="dtypes.*complex64"):
        k.load(("float32", "complex64"))
    assert made == []
