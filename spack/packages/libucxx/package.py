# SPDX-License-Identifier: Apache-2.0
"""libucxx, the C++ layer of UCXX (RAPIDS); Spack's builtin repository has no package for it."""

import spack
from spack.package import *

try:  # Spack >= 1.0 (package API v2)
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack < 1.0
    pass

# Compilers became dependencies ("c", "cxx" virtuals) in Spack 0.23.0; older Spack has no such package.
LANGUAGE_VIRTUALS = spack.spack_version_info >= (0, 23, 0) and spack.spack_version_info != (0, 23, 0, "dev0")


class Libucxx(CMakePackage, CudaPackage):
    """UCXX: a C++ interface to UCX's UCP layer with object lifetime management and thread safety."""

    homepage = "https://github.com/rapidsai/ucxx"
    git = "https://github.com/rapidsai/ucxx.git"

    license("BSD-3-Clause")

    version("main", branch="main")

    variant("python", default=True, description="Build the Python notifier-thread support library")
    variant("rmm", default=False, description="CUDA multi-buffer transfers through RMM")

    root_cmakelists_dir = "cpp"

    if LANGUAGE_VIRTUALS:
        depends_on("c", type="build")
        depends_on("cxx", type="build")
    depends_on("cmake@3.26.4:", type="build")
    depends_on("ninja", type="build")
    depends_on("python", type="build", when="+python")

    depends_on("ucx@1.15:")
    depends_on("ucx+cuda", when="+cuda")
    depends_on("librmm", when="+rmm")
    conflicts("+rmm", when="~cuda", msg="RMM needs CUDA")

    generator("ninja")

    def cmake_args(self):
        return [
            self.define("BUILD_TESTS", False),
            self.define("BUILD_BENCHMARKS", False),
            self.define("BUILD_SHARED_LIBS", True),
            self.define_from_variant("UCXX_ENABLE_PYTHON", "python"),
            self.define_from_variant("UCXX_ENABLE_RMM", "rmm"),
        ]
