# Sourced by the GPU machine's 2-nodes-on-one-GPU scripts (net_slice_ab.sh, net_replay_ab.sh, net_bw_probe.sh):
# the environment they share (NVLS off, Open MPI without UCX, MPS pipes), the libucx wheel carried in .whl/,
# the extensions built in place, $OUT, the MPS daemon (quit on exit) and $M, an mpirun of ranks as nodes
# (HPCCL_NODE_ID=split:1) on GPU 0 with NCCL forced onto its sockets (NCCL_HOSTID per rank comes from
# tests/scripts/nccl_hostid.sh).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONDONTWRITEBYTECODE=1
export UCX_WARN_UNUSED_ENV_VARS=n OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_btl=^uct
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
python3 setup.py -q build_ext --inplace >/tmp/b.log 2>&1 || tail -3 /tmp/b.log
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT" /tmp/mps_pipe /tmp/mps_log
[ -n "$SPLIT_LOG" ] && exec > >(tee -a "$OUT/$SPLIT_LOG") 2>&1
nvidia-cuda-mps-control -d && trap 'echo quit | nvidia-cuda-mps-control' EXIT
M="mpirun --allow-run-as-root --oversubscribe --bind-to none -x HPCCL_NODE_ID=split:1 -x CUDA_VISIBLE_DEVICES=0"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PYTHONPATH CUPY_CACHE_DIR \
         CUDA_MPS_PIPE_DIRECTORY UCX_WARN_UNUSED_ENV_VARS; do [ -n "${!v+x}" ] && M="$M -x $v"; done
M="$M -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_IB_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
