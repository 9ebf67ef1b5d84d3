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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("src", SOURCES, ids=[s.name for s in SOURCES])
def test_nvcc_compiles(src, arch, tmp_path):
    out = tmp_path / (src.stem + ".cubin")
    proc = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-std=c++17", "-DHPCCL_INSTANTIATE_ALL",
                           "-Werror", "all-warnings",
                           "-I", str(ROOT / "cuda"), "-o", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
