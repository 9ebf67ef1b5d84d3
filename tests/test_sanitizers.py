"""hpccl's native network engine (the hpccl._netengine extension, from setup.py's NET_SOURCES) built with
ThreadSanitizer and AddressSanitizer and driven from several threads (tests/scripts/engine_drive.py): no
race, no memory error. UCX's own malloc and mmap hooks are turned off (UCX_MEM_EVENTS=no): they fight the
sanitizers' interceptors. The node's hot path (the hpccl._hotpath extension, from setup.py's HOT_SOURCES: no
threads of its own) under AddressSanitizer across 2 ranks."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _sources(name: str) -> list[Path]:
    """An extension's C sources, as setup.py lists them (NET_SOURCES: the engine; HOT_SOURCES: the hot path)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return [ROOT / s for s in ast.literal_eval(node.value)]
    raise AssertionError(f"setup.py has no {name} list")


SAN = {"thread": ("libtsan.so", "ThreadSanitizer", {"TSAN_OPTIONS": "halt_on_error=0 report_signal_unsafe=0"}),
       "address": ("libasan.so", "AddressSanitizer", {"ASAN_OPTIONS": "detect_leaks=0"})}


def _ucx() -> Path:
    try:
        import libucx
    except ImportError:
        pytest.skip("the libucx wheel (UCX headers and libraries) is not installed: pip install hpccl[ucx]")
    base = Path(libucx.__file__).parent
    if not (base / "include" / "ucp" / "api" / "ucp.h").is_file():
        pytest.skip("the libucx wheel here has no ucp headers")
    return base


@pytest.mark.parametrize("kind", sorted(SAN))
def test_engine_under_sanitizer(kind, tmp_path):
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed (the sanitizer runtimes come with it)")
    lib, name, opts = SAN[kind]
    runtime = subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip(f"gcc has no {lib} runtime here")
    ucx = _ucx()
    out = tmp_path / ("_netengine" + sysconfig.get_config_var("EXT_SUFFIX"))
    build = subprocess.run([cc, f"-fsanitize={kind}", "-fno-omit-frame-pointer", "-g", "-O1", "-std=c11",
                            "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-isystem",
                            str(ucx / "include"), f"-I{sysconfig.get_paths()['include']}",
                            *map(str, _sources("NET_SOURCES")), f"-L{ucx / 'lib'}", "-lucp", "-lucs", "-lucm",
                            "-o", str(out)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    env = dict(os.environ, LD_PRELOAD=runtime, UCX_MEM_EVENTS="no", UCX_WARN_UNUSED_ENV_VARS="n", **opts)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "engine_drive.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert f"WARNING: {name}" not in report and f"ERROR: {name}" not in report, report[-6000:]
    assert proc.returncode == 0 and "DRIVE OK" in proc.stdout, report[-6000:]


def test_hotpath_under_address_sanitizer(tmp_path):
    """The compiled hot path (its core hpccl/csrc/_hotcore.c and its type hpccl/csrc/_hotpath.c: shared-memory
    slots, and the direct calls that read and write peers' memory through process_vm_readv/writev or through
    alloc_host's mappings, scratch copies of overlapping inputs, chunked reductions) built with AddressSanitizer and run as
    the 2-rank hot-path and alloc_host suites: no memory error."""
    from mpirun import run_pytest_mpi
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("gcc is not installed (the sanitizer runtimes come with it)")
    lib, name, opts = SAN["address"]
    runtime = subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(runtime) or not os.path.exists(runtime):
        pytest.skip(f"gcc has no {lib} runtime here")
    pkg = tmp_path / "hpccl"
    shutil.copytree(ROOT / "hpccl", pkg, ignore=shutil.ignore_patterns("_hotpath*.so", "__pycache__"))
    out = pkg / ("_hotpath" + sysconfig.get_config_var("EXT_SUFFIX"))
    build = subprocess.run([cc, "-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1", "-std=c11", "-Wall",
                            "-Wextra", "-Werror", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                            *map(str, _sources("HOT_SOURCES")), "-o", str(out)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    log = tmp_path / "asan"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "LD_PRELOAD": runtime,
           "ASAN_OPTIONS": f"{opts['ASAN_OPTIONS']} log_path={log}"}
    probe = subprocess.run([sys.executable, "-c", "import hpccl._hotpath as h; print(h.__file__); "
                            "print('libasan' in open('/proc/self/maps').read())"],
                           env=dict(os.environ, **env), capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.split() == [str(out), "True"], probe.stdout + probe.stderr[-2000:]  # the instrumented build
    summary = run_pytest_mpi(2, ["tests/mpi/mpi_hotpath.py", "tests/mpi/mpi_alloc_host.py"],
                             "mpi_hotpath.py and mpi_alloc_host.py under AddressSanitizer, 2 ranks", env=env)
    assert summary["passed"] > 0
    reports = [p.read_text() for p in tmp_path.glob("asan*")]
    assert not any(f"ERROR: {name}" in r for r in reports), "\n".join(reports)[-6000:]
