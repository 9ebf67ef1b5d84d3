# SPDX-License-Identifier: Apache-2.0
"""ucxx, the Python layer of UCXX (RAPIDS); builds python/ucxx against Spack's libucxx and ucx."""

import spack
from spack.package import *

try:  # Spack >= 1.0 (package API v2)
    from spack_repo.builtin.build_systems.cuda import CudaPackage
    from spack_repo.builtin.build_systems.python import PythonPackage
except ImportError:  # Spack < 1.0
    pass

# Compilers became dependencies ("c", "cxx" virtuals) in Spack 0.23.0; older Spack has no such package.
LANGUAGE_VIRTUALS = spack.spack_version_info >= (0, 23, 0) and spack.spack_version_info != (0, 23, 0, "dev0")


class PyUcxx(PythonPackage, CudaPackage):
    """Python bindings for UCXX (the successor of ucx-py): UCX endpoints, tag send/receive."""

    homepage = "https://github.com/rapidsai/ucxx"
    git = "https://github.com/rapidsai/ucxx.git"

    license("BSD-3-Clause")

    version("main", branch="main")

    build_directory = "python/ucxx"

    if LANGUAGE_VIRTUALS:
        depends_on("c", type="build")
        depends_on("cxx", type="build")
    depends_on("python@3.10:", type=("build", "run"))
    depends_on("py-scikit-build-core", type="build")
    depends_on("py-cython@3:", type="build")
    depends_on("cmake@3.26.4:", type="build")
    depends_on("ninja", type="build")

    depends_on("py-numpy", type=("build", "run"))
    depends_on("py-nvidia-ml-py", type=("build", "run"))
    depends_on("libucxx+python")
    depends_on("ucx")

    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"libucxx+cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    depends_on("libucxx~cuda", when="~cuda")

    def setup_build_environment(self, env):
        # Build against the libucxx/ucx that Spack installed, not wheels found on PyPI.
        env.set("SKBUILD_CMAKE_ARGS", f"-Ducxx_ROOT={self.spec['libucxx'].prefix}")
