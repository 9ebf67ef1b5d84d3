"""What pyproject.toml cannot say: hpccl's compiled parts, both optional (without a C compiler, or without
UCX headers, the install still succeeds and hpccl-info says which slower path is in use):

* hpccl._hotpath: small host collectives within a node (its core in plain C, hpccl/csrc/_hotcore.c; its
  Python type, hpccl/csrc/_hotpath.c), and the C front door of host calls to either hot path
  (hpccl/csrc/_frontdoor.c);
* hpccl._netengine: the network engine (UCX's UCP driven by a thread that never takes the GIL; its core in
  plain C, hpccl/csrc/_netbatch.c, _netctrl.c, _netcore.c and _netcalls.c), its Python types and module
  (hpccl/csrc/_netmodule.c, _netengine.c, _netop.c, _netpy.c), the C replay of recorded GPU calls
  (hpccl/csrc/_netreplay.c) and their front door (hpccl/csrc/_netdoor.c, _netkey.c), small host collectives
  across nodes in C (hpccl/csrc/_nethot.c) and the watchdog of GPU steps' stream waits
  (hpccl/csrc/_netwatch.c); built against the UCX found in this order: HPCCL_UCX_HOME, UCX_HOME, pkg-config's
  ucx, the libucx wheel (a build requirement on Linux, so a plain ``pip install`` has it)."""
import os
import shutil
import subprocess

from setuptools import Extension, setup


def _ucx():
    """(include dir, lib dir, rpath or None) of a UCX with ucp headers, or None."""
    for var in ("HPCCL_UCX_HOME", "UCX_HOME"):
        home = os.environ.get(var)
        if home and os.path.isfile(os.path.join(home, "include", "ucp", "api", "ucp.h")):
            lib = next((os.path.join(home, d) for d in ("lib", "lib64") if os.path.isdir(os.path.join(home, d))),
                       os.path.join(home, "lib"))
            return os.path.join(home, "include"), lib, lib
    if shutil.which("pkg-config"):
        try:
            inc = subprocess.run(["pkg-config", "--variable=includedir", "ucx"], capture_output=True, text=True,
                                 check=True).stdout.strip()
            lib = subprocess.run(["pkg-config", "--variable=libdir", "ucx"], capture_output=True, text=True,
                                 check=True).stdout.strip()
            if inc and os.path.isfile(os.path.join(inc, "ucp", "api", "ucp.h")):
                return inc, lib, lib
        except (OSError, subprocess.CalledProcessError):
            pass
    try:
        import libucx  # the wheel: its libraries are found at run time next to hpccl, or already loaded
    except ImportError:
        return None
    base = os.path.dirname(libucx.__file__)
    if os.path.isfile(os.path.join(base, "include", "ucp", "api", "ucp.h")):
        return os.path.join(base, "include"), os.path.join(base, "lib"), "$ORIGIN/../libucx/lib"
    return None


# each extension's sources: its Python types, then its core in plain C (tests/test_sanitizers.py builds the
# same lists)
HOT_SOURCES = ["hpccl/csrc/_hotpath.c", "hpccl/csrc/_frontdoor.c", "hpccl/csrc/_hotcore.c"]
NET_SOURCES = ["hpccl/csrc/_netmodule.c", "hpccl/csrc/_netengine.c", "hpccl/csrc/_netop.c", "hpccl/csrc/_netreplay.c",
               "hpccl/csrc/_netdoor.c", "hpccl/csrc/_netkey.c", "hpccl/csrc/_nethot.c", "hpccl/csrc/_netwatch.c",
               "hpccl/csrc/_netpy.c", "hpccl/csrc/_netcalls.c", "hpccl/csrc/_netcore.c", "hpccl/csrc/_netctrl.c",
               "hpccl/csrc/_netbatch.c"]
exts = [Extension("hpccl._hotpath", HOT_SOURCES,
                  depends=["hpccl/csrc/_hotcore.h", "hpccl/csrc/_dtype.h", "hpccl/csrc/_reduce.h",
                           "hpccl/csrc/_copy.h"],
                  extra_compile_args=["-O3", "-std=c11"], optional=True)]
ucx = _ucx()
if ucx is not None:
    inc, lib, rpath = ucx
    exts.append(Extension("hpccl._netengine", NET_SOURCES,
                          depends=["hpccl/csrc/_netcore.h", "hpccl/csrc/_netpy.h", "hpccl/csrc/_netdoor.h",
                                   "hpccl/csrc/_lathist.h", "hpccl/csrc/_dtype.h", "hpccl/csrc/_reduce.h"],
                          extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE", "-isystem", inc],
                          library_dirs=[lib], libraries=["ucp", "ucs", "ucm"],
                          extra_link_args=[f"-Wl,-rpath,{rpath}"] if rpath else [], optional=True))
else:
    print("hpccl: no UCX headers found (HPCCL_UCX_HOME, UCX_HOME, pkg-config ucx, libucx wheel): the network "
          "engine is not built; calls across nodes use the slower MPI path")
setup(ext_modules=exts)
