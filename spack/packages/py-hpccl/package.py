"""Spack package for hpccl; loads in package API v1 (Spack < 1.0) and v2 (Spack >= 1.0) repos."""

import spack
from spack.package import *

try:  # Spack >= 1.0: build systems live in the builtin repository (package API v2)
    from spack_repo.builtin.build_systems.cuda import CudaPackage
    from spack_repo.builtin.build_systems.python import PythonPackage
except ImportError:  # Spack < 1.0: spack.package exports them
    pass

# Compilers became dependencies ("c", "cxx" virtuals) in Spack 0.23.0; older Spack has no such package.
LANGUAGE_VIRTUALS = spack.spack_version_info >= (0, 23, 0) and spack.spack_version_info != (0, 23, 0, "dev0")


class PyHpccl(PythonPackage, CudaPackage):
    """hpccl: collective communication for Python on HPC systems (all_reduce, all_gather, ...),
    bootstrapped by MPI, over shared memory, CUDA peer memory and UCX."""

    homepage = "https://github.com/hpccl/hpccl"
    git = "https://github.com/hpccl/hpccl.git"

    license("BSD-3-Clause")

    version("main", branch="main")

    # 'spack install --test=root' and 'spack test run' import these (no GPU or MPI job needed)
    import_modules = ["hpccl", "hpccl.envcheck", "hpccl.cli.info", "hpccl._hotpath"]

    variant("ucx", default=False,
            description="hpccl's native network engine over UCX between nodes (else MPI), GPUDirect RDMA")

    # GPU kernels are compiled by NVRTC at run time for the GPUs found, so cuda_arch only has to
    # match what CuPy (and UCX) are built for; like py-cupy, a +cuda build must name one.
    conflicts("+cuda cuda_arch=none", msg="+cuda needs cuda_arch, e.g. cuda_arch=90 for H100/H200")

    # the compiled hot path (hpccl._hotpath, a CPython extension in C) needs a C compiler at build time
    if LANGUAGE_VIRTUALS:
        depends_on("c", type="build")
    depends_on("python@3.10:", type=("build", "run"))
    depends_on("py-setuptools@68:", type="build")
    depends_on("py-wheel", type="build")

    depends_on("mpi")
    depends_on("py-mpi4py@3.1:", type=("build", "run"))
    depends_on("py-numpy@1.24:", type=("build", "run"))
    depends_on("py-ml-dtypes", type=("build", "run"))

    with when("+cuda"):
        depends_on("py-nvidia-ml-py", type=("build", "run"))
        for _arch in CudaPackage.cuda_arch_values:
            depends_on(f"py-cupy+cuda cuda_arch={_arch}", type=("build", "run"),
                       when=f"cuda_arch={_arch}")

    with when("+ucx"):
        # the native network engine (hpccl._netengine) is built and linked against this UCX
        depends_on("ucx+verbs+rc+dc+mlx5_dv+rdmacm+thread_multiple")
    with when("+ucx+cuda"):
        for _arch in CudaPackage.cuda_arch_values:
            depends_on(f"ucx+cuda+gdrcopy cuda_arch={_arch}", when=f"cuda_arch={_arch}")

    def setup_build_environment(self, env):
        # setup.py builds the native network engine (hpccl._netengine) against Spack's UCX
        if self.spec.satisfies("+ucx"):
            env.set("UCX_HOME", self.spec["ucx"].prefix)

    def setup_run_environment(self, env):
        # Same defaults as the Lmod modulefile in modulefiles/hpccl/ of the source tree.
        env.set("HPCCL_CHECK_ENV", "1")
        if self.spec.satisfies("+ucx"):
            env.set("HPCCL_NET", "ucx")
            env.set("OMPI_MCA_pml", "ucx")
