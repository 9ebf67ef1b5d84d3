"""cuda/hpccl_device.cuh's float8 conversion block (the code hp_fp8_narrow runs), compiled on the host as
tests/test_fp8_units.py builds it, against ml_dtypes for all 2^32 float32 bit patterns, both float8 types.
Run: python bench/fp8_exhaustive.py  (about a minute per type on one core)"""
import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def build(d: Path) -> ctypes.CDLL:
    text = (ROOT / "cuda" / "hpccl_device.cuh").read_text()
    block = re.search(r"// ---- float8 <-> float32 \(begin\) ----\n(.*)// ---- float8 <-> float32 \(end\) ----",
                      text, re.S).group(1)
    (d / "fp8.c").write_text("#define HP_HD static inline\n" + block + """
void narrow(const unsigned int *x, unsigned char *y, long n, int k) {
  for (long i = 0; i < n; i++) y[i] = (unsigned char)hp_f32_to_fp8(x[i], k);
}
""")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(d / "fp8.so"),
                    str(d / "fp8.c")], check=True)
    return ctypes.CDLL(str(d / "fp8.so"))


def main() -> int:
    chunk = 1 << 26
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        bad_total = 0
        for k, name in enumerate(("float8_e4m3fn", "float8_e5m2")):
            dt, bad = np.dtype(getattr(ml_dtypes, name)), 0
            y = np.empty(chunk, np.uint8)
            for c in range((1 << 32) // chunk):
                x = np.arange(c * chunk, (c + 1) * chunk, dtype=np.uint64).astype(np.uint32)
                lib.narrow(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_long(chunk), k)
                bad += int(np.count_nonzero(y != x.view(np.float32).astype(dt).view(np.uint8)))
            print(f"{name}: all 2^32 float32 inputs, mismatches with ml_dtypes {ml_dtypes.__version__}: {bad}",
                  flush=True)
            bad_total += bad
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
