"""spack/: the package files load under package API v1 and v2 (with stand-in spack modules), and,
where a real Spack exists (SPACK_ROOT or spack on PATH), 'spack info' and 'spack spec' concretize."""
import contextlib
import os
import shutil
import subprocess
import sys
import types

import pytest
from deployutil import REPO

SPACK = REPO / "spack"
PACKAGES = {"py-hpccl": "PyHpccl"}


class Recorder:
    """Stand-in for Spack's directive functions: records (directive, args, when) calls."""

    def __init__(self):
        self.calls = []
        self.when = []

    def directive(self, name):
        def record(*args, **kwargs):
            when = " ".join(self.when + ([kwargs["when"]] if "when" in kwargs else []))
            self.calls.append((name, args, kwargs, when))
        return record

    @contextlib.contextmanager
    def when_ctx(self, spec):
        self.when.append(spec)
        yield
        self.when.pop()


def load_package(pkg, api):
    """Execute spack/packages/<pkg>/package.py with fake spack modules for package API ``api``."""
    rec = Recorder()

    class Base:
        cuda_arch_values = ("70", "80", "90", "100")

    bases = {n: type(n, (Base,), {}) for n in ("PythonPackage", "CudaPackage", "CMakePackage")}
    pkgmod = types.ModuleType("spack.package")
    for d in ("version", "variant", "depends_on", "conflicts", "license", "maintainers", "generator",
              "extends", "provides"):
        setattr(pkgmod, d, rec.directive(d))
    pkgmod.when = rec.when_ctx
    pkgmod.run_after = lambda *a, **k: (lambda f: f)
    pkgmod.on_package_attributes = lambda **k: (lambda f: f)
    pkgmod.__all__ = [n for n in vars(pkgmod) if not n.startswith("_")]
    spack = types.ModuleType("spack")
    spack.spack_version_info = (0, 22, 2) if api == 1 else (1, 1, 0)
    spack.package = pkgmod
    mods = {"spack": spack, "spack.package": pkgmod}
    if api == 1:
        for n, cls in bases.items():
            setattr(pkgmod, n, cls)
        pkgmod.__all__ += list(bases)
    else:
        for sub, n in (("python", "PythonPackage"), ("cuda", "CudaPackage"), ("cmake", "CMakePackage")):
            m = types.ModuleType(f"spack_repo.builtin.build_systems.{sub}")
            setattr(m, n, bases[n])
            mods[m.__name__] = m
        for name in ("spack_repo", "spack_repo.builtin", "spack_repo.builtin.build_systems"):
            mods[name] = types.ModuleType(name)
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        code = compile((SPACK / "packages" / pkg / "package.py").read_text(), pkg, "exec")
        ns = {"__name__": f"spack.pkg.hpccl.{pkg.replace('-', '_')}"}
        exec(code, ns)  # noqa: S102  (our own package file)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    cls = ns[PACKAGES[pkg]]
    return cls, rec.calls, bases


@pytest.mark.parametrize("api", [1, 2])
@pytest.mark.parametrize("pkg", sorted(PACKAGES))
def test_package_loads(pkg, api):
    cls, calls, bases = load_package(pkg, api)
    assert issubclass(cls, bases["CudaPackage"])
    assert any(c[0] == "version" for c in calls)
    langs = [c for c in calls if c[0] == "depends_on" and c[1][0] in ("c", "cxx")]
    assert bool(langs) == (api == 2)  # 0.22 has no c/cxx virtuals; py-hpccl's hot path is C


def test_py_hpccl_directives():
    _, calls, _ = load_package("py-hpccl", 2)
    deps = {(c[1][0], c[3]) for c in calls if c[0] == "depends_on"}
    names = {d[0].split("@")[0].split("+")[0] for d in deps}
    for need in ("mpi", "py-mpi4py", "py-numpy", "py-ml-dtypes", "py-nvidia-ml-py", "python"):
        assert need in names, need
    assert not names & {"py-ucxx", "libucxx"}, names  # the ucxx transport is gone: UCX alone, for the engine
    assert ("py-cupy+cuda cuda_arch=90", "+cuda cuda_arch=90") in deps
    assert ("py-nvidia-ml-py", "+cuda") in deps
    ucx = [d for d in deps if d[0].startswith("ucx")]
    assert ("ucx+verbs+rc+dc+mlx5_dv+rdmacm+thread_multiple", "+ucx") in ucx
    assert ("ucx+cuda+gdrcopy cuda_arch=90", "+ucx+cuda cuda_arch=90") in ucx
    variants = {c[1][0] for c in calls if c[0] == "variant"}
    assert "ucx" in variants
    assert any(c[0] == "conflicts" and c[1][0] == "+cuda cuda_arch=none" for c in calls)


def test_repo_layouts():
    """v1: spack/repo.yaml + packages/<name>; v2: spack/spack_repo/hpccl (api v2.0) + module-named dirs."""
    assert repo_yaml(SPACK / "repo.yaml", "namespace") == "hpccl"
    v2 = SPACK / "spack_repo" / "hpccl"
    assert repo_yaml(v2 / "repo.yaml", "api") == "v2.0"
    for pkg in PACKAGES:
        link = v2 / "packages" / pkg.replace("-", "_")
        assert link.is_dir() and (link / "package.py").samefile(SPACK / "packages" / pkg / "package.py")


def repo_yaml(path, key):
    """'key: value' from a flat repo.yaml, without PyYAML."""
    for line in open(path):
        k, _, v = line.strip().partition(":")
        if k == key:
            return v.strip().strip("'\"")
    return None


def spack_command():
    root = os.environ.get("SPACK_ROOT")
    if root and os.access(os.path.join(root, "bin", "spack"), os.X_OK):
        return os.path.join(root, "bin", "spack")
    return shutil.which("spack")


@pytest.mark.skipif(not spack_command(), reason="no Spack here (Spack is not on PyPI or Debian): set SPACK_ROOT "
                    "or put spack on PATH to run 'spack info/spec' on the repo; a real run is in docs/deploy/")
def test_real_spack_concretizes():
    r = subprocess.run(["bash", str(REPO / "scripts/deploy/spack-check.sh"), "py-hpccl+cuda+ucx cuda_arch=90"],
                       capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "Added repo with namespace 'hpccl'" in out
    spec = out.split("$ spack spec py-hpccl+cuda+ucx cuda_arch=90", 1)[1]
    top = next(line for line in spec.splitlines() if "py-hpccl@" in line)
    assert "+cuda" in top and "+ucx" in top and "cuda_arch=90" in top, top
    ucx = next(line for line in spec.splitlines() if "^ucx@" in line)
    for v in ("+cuda", "+gdrcopy", "+verbs", "+rc", "+dc", "+mlx5_dv", "+rdmacm"):
        assert v in ucx, (v, ucx)
    for dep in ("^py-cupy@", "^py-mpi4py@", "^py-nvidia-ml-py@", "^py-ml-dtypes@"):
        assert dep in spec, dep
    assert "^py-ucxx@" not in spec and "^libucxx@" not in spec, spec
