-- Lmod modulefile for hpccl 0.1.0 (collective communication for Python on HPC systems).
-- Install:  scripts/deploy/install-module.sh PREFIX [MODULEROOT]   (fills in @PREFIX@), or copy it to
-- PREFIX/share/modulefiles/hpccl/0.1.0.lua, where an unfilled @PREFIX@ is found from its own path.
-- The prefix is a venv (python -m venv PREFIX; PREFIX/bin/pip install hpccl) or a
-- 'pip install --prefix PREFIX hpccl' tree; both layouts are handled below.

local version = "0.1.0"
local prefix = "@PREFIX@"
if prefix:find("@", 1, true) then
    -- PREFIX/share/modulefiles/hpccl/0.1.0.lua -> PREFIX
    prefix = myFileName():gsub("/share/modulefiles/hpccl/[^/]+$", "")
end

whatis("Name: hpccl")
whatis("Version: " .. version)
whatis("Category: library, communication, MPI, GPU")
whatis("Description: NCCL-like collectives (all_reduce, all_gather, ...) for Python, bootstrapped by MPI")
whatis("URL: https://github.com/hpccl/hpccl")

help([[
hpccl ]] .. version .. [[ - collective communication for Python on HPC systems.

  import hpccl; comm = hpccl.init(); comm.all_reduce(x)

Commands:
  hpccl-info                      versions, HPCCL_* settings, topology
  srun --mpi=pmix hpccl-perf all_reduce -b 8 -e 64M -f 2 --check
                                  nccl-tests style benchmark (--mpi=pmi2 for the PyPI mpich)

Settings (environment; 'hpccl-info' lists them all):
  HPCCL_DEBUG=WARN|INFO|TRACE     log level (set to WARN here if unset)
  HPCCL_CHECK_ENV=1               check /dev/shm, memlock and GPU peer access at init
  HPCCL_TIMEOUT=300               seconds before a collective gives up and aborts

Installed in: ]] .. prefix .. [[

]])

conflict("hpccl")
family("hpccl")

-- A venv prefix carries its own python (with numpy, mpi4py, ...): its bin goes first on PATH.
prepend_path("PATH", pathJoin(prefix, "bin"))
-- A 'pip install --prefix' tree is used by the matching python that the site's python module provides.
for _, pyver in ipairs({"3.10", "3.11", "3.12", "3.13", "3.14"}) do
    local site = pathJoin(prefix, "lib", "python" .. pyver, "site-packages")
    if isDir(site) and not isFile(pathJoin(prefix, "pyvenv.cfg")) then
        prepend_path("PYTHONPATH", site)
    end
end
setenv("HPCCL_ROOT", prefix)
setenv("HPCCL_VERSION", version)

-- Defaults that a user's own setting wins over.
if not os.getenv("HPCCL_DEBUG") then setenv("HPCCL_DEBUG", "WARN") end
if not os.getenv("HPCCL_CHECK_ENV") then setenv("HPCCL_CHECK_ENV", "1") end
-- Site choices, uncomment as needed:
-- setenv("HPCCL_NET", "ucx")            -- UCX between nodes (InfiniBand/RoCE with GPUDirect RDMA)
-- setenv("OMPI_MCA_pml", "ucx")         -- Open MPI over UCX too
-- setenv("UCX_NET_DEVICES", "mlx5_0:1") -- pin the HCA
-- depends_on("openmpi")                 -- the MPI that mpi4py was built against
