"""The torch backend's compiled part (hpccl/torch/_native.cpp), built with the C++ compiler against the
torch that is imported, on first use, and cached per source, torch and Python version. Ranks starting
together build it once (a file lock). Any failure (no compiler, headers of another torch) is logged once
and the Python backend serves alone: nothing changes but the speed."""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import List, Optional

from .. import config, log

NAME = "hpccl_torch_native"
SOURCE = Path(__file__).with_name("_native.cpp")
_loaded: dict = {}


def cache_dir() -> Path:
    d = config.get("HPCCL_CACHE_DIR")
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpccl"


def _flags() -> List[str]:
    import torch.utils.cpp_extension as ext
    cx = os.environ.get("CXX", "c++")
    flags = [cx, "-O2", "-shared", "-fPIC", "-std=c++20", "-Wall", "-Wextra", f"-DTORCH_EXTENSION_NAME={NAME}",
             "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for name in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        fn = getattr(ext, name, None)
        if fn is not None:
            with warnings.catch_warnings():  # torch's note that these are internal: nothing for a user to do
                warnings.simplefilter("ignore", DeprecationWarning)
                flags += fn()
    for inc in [*ext.include_paths(), sysconfig.get_paths()["include"]]:
        flags += ["-isystem", inc]  # torch's own headers' warnings are not ours
    for lib in ext.library_paths():
        flags += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
    return flags


def _tag() -> str:
    import torch
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{torch.__file__}|{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return h.hexdigest()[:16]


def build(out_dir: Path) -> Path:
    """Compile the extension into out_dir (under a lock; a finished build is reused). Raises on failure,
    with the compiler's output."""
    so = out_dir / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.exists():
            return so
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
        os.close(fd)
        try:
            cmd = [*_flags(), str(SOURCE), "-o", tmp, "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:2])} ... failed ({r.returncode}):\n{r.stderr[-3000:]}")
            if r.stderr.strip():
                log.warn("INIT", "torch native backend: compiler warnings:\n%s", r.stderr[-3000:])
            os.replace(tmp, so)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return so


def load() -> Optional[ModuleType]:
    """The compiled module, or None (HPCCL_TORCH_NATIVE=0, or it could not be built or loaded)."""
    if "mod" in _loaded:
        return _loaded["mod"]
    mod = None
    if config.get("HPCCL_TORCH_NATIVE"):
        try:
            import torch.distributed  # noqa: F401 - c10d's Python types must exist before the module's
            so = build(cache_dir() / f"torch-native-{_tag()}")
            spec = importlib.util.spec_from_file_location(NAME, so)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the Python backend in charge
            log.warn("INIT", "torch backend: compiled all_reduce unavailable, the Python backend serves "
                     "alone (%s: %s)", type(exc).__name__, exc)
            mod = None
    _loaded["mod"] = mod
    return mod


if __name__ == "__main__":  # python -m hpccl.torch.native: build now (scripts/setup.sh), say where
    m = load()
    print(f"hpccl torch native backend: {m.__file__ if m is not None else 'unavailable (see the warning above)'}")
    raise SystemExit(0 if m is not None else 1)
