"""Every kernel source, every template instantiation, compiles with nvcc for sm_80 and sm_90 with
warnings as errors (CI has nvcc;
the kernels run on the GPU machine through bench/gpu_suite.sh)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "cuda").glob("*.cu"))


ARCHS = ("sm_80", "sm_90")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("src", SOURCES, ids=[s.name for s in SOURCES])
def test_nvcc_compiles(src, tmp_path):
    """Both architectures at once (one nvcc per core: the instantiations take most of a minute each)."""
    procs = {}
    for arch in ARCHS:
        out = tmp_path / f"{src.stem}_{arch}.cubin"
        procs[arch] = (out, subprocess.Popen(["nvcc", f"-arch={arch}", "-cubin", "-std=c++17", "-DHPCCL_INSTANTIATE_ALL",
                                              "-Werror", "all-warnings", "-I", str(ROOT / "cuda"), "-o", str(out),
                                              str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for arch, (out, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{arch}: {err}"
        assert out.stat().st_size > 0, arch

def test_the_kernel_source_inlines_every_header():
    """NVRTC gets one text (hpccl/kernels.py source_text): every file the kernels include is inlined, none is
    missing from the packaged SOURCES, and the text holds each part's kernels."""
    from hpccl import kernels
    text = kernels.source_text()
    assert "#include" not in text
    assert {p.name for p in (ROOT / "cuda").glob("*.cu*")} == set(kernels.SOURCES)
    for kernel in ("hp_copy_push", "hp_reg_copy", "hp_s_push", "hp_net_pipe", "hp_fp8_narrow"):
        assert f" {kernel}(" in text, kernel


def _header_defines() -> dict:
    """The header's integer #defines (HPCCL_*), evaluated in order."""
    import re
    vals: dict = {}
    for m in re.finditer(r"^#define (HPCCL_\w+) ([^/\n]+)", (ROOT / "cuda" / "hpccl_device.cuh").read_text(), re.M):
        expr = m.group(2).strip().rstrip("u")
        try:
            vals[m.group(1)] = eval(expr, {}, vals)  # noqa: S307 - our own header's arithmetic
        except Exception:  # noqa: BLE001 - not an integer define
            pass
    return vals


def test_ctypes_mirror_the_header():
    """hpccl/kernels.py's structs and flag-area constants agree with cuda/hpccl_device.cuh (the kernels'
    static_asserts pin the C sizes; a drift here would make every launch read garbage)."""
    import ctypes
    import re
    from hpccl import kernels
    text = (ROOT / "cuda" / "hpccl_device.cuh").read_text()
    sizes = dict(re.findall(r"static_assert\(sizeof\((\w+)\) == (\d+)", text))
    assert set(sizes) == {"CommArgs", "P2POp", "P2PArgs", "RegArgs", "SafeArgs"}
    for name, size in sizes.items():
        assert ctypes.sizeof(getattr(kernels, name)) == int(size), name
    d = _header_defines()
    assert d["HPCCL_FLAG_WORDS"] == kernels.FLAG_WORDS
    assert d["HPCCL_CTR_REG"] == kernels.CTR_REG
    assert d["HPCCL_CTR_SEND"] == kernels.CTR_SEND
    assert (d["HPCCL_ERR_TIMEOUT"], d["HPCCL_ERR_ABORT"], d["HPCCL_ERR_MISMATCH"], d["HPCCL_ERR_DEAD"]) == (
        kernels.ERR_TIMEOUT, kernels.ERR_ABORT, kernels.ERR_MISMATCH, kernels.ERR_DEAD)
    assert (d["HPCCL_MAX_RANKS"], d["HPCCL_MAX_BLOCKS"]) == (kernels.MAX_RANKS, kernels.MAX_BLOCKS)
