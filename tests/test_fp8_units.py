"""float8 units: the GPU kernels' conversion code (cuda/hpccl_device.cuh, plain C) compiled on the host and
checked against ml_dtypes bit for bit; the host's widening and single rounding; the registry; the lazy
import of ml_dtypes."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpccl.core import fp8
from hpccl.errors import HpcclInvalidArgument
from hpccl.memory import host
from hpccl.ops import AVG, DTYPES, FP8_NAMES, check_op_dtype, dtype_name, floating, fp8_name, ml_dtype, supported

ROOT = Path(__file__).resolve().parent.parent


def _boundary_floats() -> np.ndarray:
    """Every float32 upper half with low halves at and around each rounding point (ties, one past, one
    short), plus random bit patterns: NaNs, infinities, subnormals and overflow included."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x3FFF, 0x4000, 0x4001, 0x1FFF, 0x2000, 0x2001],
                    np.uint32)
    rnd = np.random.default_rng(0).integers(0, 1 << 32, 1 << 21, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([(hi[:, None] | lows[None, :]).ravel(), rnd])


@pytest.fixture(scope="module")
def kernel_code(tmp_path_factory):
    """The block between the header's float8 markers, built as a host library (HP_HD: static inline)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    text = (ROOT / "cuda" / "hpccl_device.cuh").read_text()
    block = re.search(r"// ---- float8 <-> float32 \(begin\) ----\n(.*)// ---- float8 <-> float32 \(end\) ----",
                      text, re.S)
    assert block, "the float8 conversion block's markers are missing from hpccl_device.cuh"
    d = tmp_path_factory.mktemp("fp8c")
    (d / "fp8.c").write_text("#define HP_HD static inline\n" + block.group(1) + """
void narrow(const unsigned int *x, unsigned char *y, long n, int k) {
  for (long i = 0; i < n; i++) y[i] = (unsigned char)hp_f32_to_fp8(x[i], k);
}
void widen(const unsigned char *x, unsigned int *y, long n, int k) {
  for (long i = 0; i < n; i++) y[i] = hp_fp8_to_f32(x[i], k);
}
""")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(d / "fp8.so"),
                    str(d / "fp8.c")], check=True)
    return ctypes.CDLL(str(d / "fp8.so"))


@pytest.mark.parametrize("name", FP8_NAMES)
def test_kernel_conversions_equal_ml_dtypes(kernel_code, name):
    """hp_fp8_to_f32 on all 256 codes and hp_f32_to_fp8 around every rounding point: ml_dtypes' results."""
    dt, k, P = ml_dtype(name), FP8_NAMES.index(name), ctypes.c_void_p
    b, w = np.arange(256, dtype=np.uint8), np.empty(256, np.uint32)
    kernel_code.widen(P(b.ctypes.data), P(w.ctypes.data), ctypes.c_long(256), k)
    assert np.array_equal(w, b.view(dt).astype(np.float32).view(np.uint32))
    x = _boundary_floats()
    y = np.empty(x.size, np.uint8)
    kernel_code.narrow(P(x.ctypes.data), P(y.ctypes.data), ctypes.c_long(x.size), k)
    ref = x.view(np.float32).astype(dt).view(np.uint8)
    bad = np.nonzero(y != ref)[0]
    assert bad.size == 0, [(hex(x[i]), hex(y[i]), hex(ref[i])) for i in bad[:8]]


@pytest.mark.parametrize("name", FP8_NAMES)
def test_host_widen_exact_and_round_once(name):
    """The host path: widening is exact; rounding a float32 is one round-to-nearest-even (ties included),
    e4m3fn's overflow is NaN and e5m2's infinity, as ml_dtypes converts."""
    dt = ml_dtype(name)
    codes = np.arange(256, dtype=np.uint8).view(dt)
    wide = fp8.widen(None, host, None, codes, name)
    assert wide.dtype == np.float32
    back = np.empty(256, dt)
    fp8.narrow(host, None, back, wide, name)
    nan = np.isnan(wide)
    assert np.array_equal(back.view(np.uint8)[~nan], codes.view(np.uint8)[~nan])
    big = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}[name]
    step = {"float8_e4m3fn": 32.0, "float8_e5m2": 8192.0}[name]  # the last step below the largest value
    x = np.array([1.0 + 2.0 ** -(3 if name == "float8_e4m3fn" else 2) / 2, big + step / 2, big + step, -1e9],
                 np.float32)  # a tie to even (down to 1.0), a tie at the top, past the top, far past
    out = np.empty(4, dt)
    fp8.narrow(host, None, out, x, name)
    got = out.astype(np.float32)
    assert got[0] == 1.0
    if name == "float8_e4m3fn":  # 448 is 1.110b x 2^8: the tie goes down to it (even); past it, NaN
        assert got[1] == big and np.isnan(got[2]) and np.isnan(got[3])
    else:  # 57344 is 1.11b x 2^15 (odd): the tie goes up, past the top, to infinity
        assert got[1] == np.inf and got[2] == np.inf and got[3] == -np.inf


def test_registry():
    """Both float8 types are supported, floating (avg allowed), named by their ml_dtypes names; dtype= must
    name one of them and be given 1-byte words."""
    for name in FP8_NAMES:
        dt = DTYPES[name]
        assert dt == ml_dtype(name) and supported(dt) and floating(dt) and dtype_name(dt) == name
        assert fp8_name(dt) == name
        check_op_dtype(AVG, dt)
    assert fp8_name(np.dtype(np.uint8)) is None and fp8_name(DTYPES["bfloat16"]) is None
    words = np.zeros(4, np.uint8)
    assert fp8.of(host, words, words, "float8_e5m2") == ml_dtype("float8_e5m2")
    assert fp8.of(host, words, words, None) is None
    assert fp8.of(host, words, words, ml_dtype("float8_e4m3fn")) == ml_dtype("float8_e4m3fn")
    for bad in ("float16", "float8_e4m3fnuz", 3):
        with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
            fp8.of(host, words, words, bad)
    f32 = np.zeros(4, np.float32)
    with pytest.raises(HpcclInvalidArgument, match="'dtype'.*1-byte words"):
        fp8.of(host, f32, f32, "float8_e4m3fn")
    torch = pytest.importorskip("torch")
    assert fp8.of(host, words, words, torch.float8_e5m2) == ml_dtype("float8_e5m2")


def test_ml_dtypes_is_imported_only_for_float8_or_bfloat16():
    """A job that never touches bfloat16 or float8 never imports ml_dtypes (its checks included); reading
    hpccl.float8_e4m3fn does, and a float8 all_reduce of one rank rounds its float32 once."""
    code = ("import sys, numpy as np, hpccl\n"
            "c = hpccl.init(); x = np.arange(8, dtype=np.float32); c.all_reduce(x)\n"
            "assert 'float8_e5m2' in hpccl.DTYPES and hpccl.ops.fp8_name(x.dtype) is None\n"
            "c.all_reduce(np.zeros(3, np.uint8), op='max')\n"
            "before = 'ml_dtypes' in sys.modules\n"
            "y = np.full(4, 3.25, dtype=hpccl.float8_e4m3fn); c.all_reduce(y, op='avg')\n"
            "print(before, 'ml_dtypes' in sys.modules, str(y.dtype), float(y[0])); c.destroy()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "float8_e4m3fn", "3.25"]
