#!/bin/bash
# HPCCL_NET_SLICE A/B on the one-GPU machine: 2 ranks as 2 nodes (HPCCL_NODE_ID=split:1) on one GPU under MPS,
# hpccl-perf vs NCCL sockets (NCCL_HOSTID per rank), slice sizes interleaved over ROUNDS rounds, every result
# checked; then the other collectives and the quick GPU matrix at split:1 with a small slice (correctness).
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONDONTWRITEBYTECODE=1
export UCX_WARN_UNUSED_ENV_VARS=n OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_btl=^uct
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
python3 setup.py -q build_ext --inplace >/tmp/b.log 2>&1 || tail -3 /tmp/b.log
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT" /tmp/mps_pipe /tmp/mps_log
nvidia-cuda-mps-control -d && trap 'echo quit | nvidia-cuda-mps-control' EXIT
M="mpirun --allow-run-as-root --oversubscribe --bind-to none -x HPCCL_NODE_ID=split:1 -x CUDA_VISIBLE_DEVICES=0"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PYTHONPATH CUPY_CACHE_DIR \
         CUDA_MPS_PIPE_DIRECTORY UCX_WARN_UNUSED_ENV_VARS; do [ -n "${!v+x}" ] && M="$M -x $v"; done
M="$M -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_IB_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
rc=0
for round in $(seq ${ROUNDS:-2}); do
  for sl in ${SLICES:-0 1M 256K}; do
    for c in ${COLLS:-all_reduce all_gather}; do
      echo "=== round $round, HPCCL_NET_SLICE=$sl, $c ($(date -u +%T))"
      timeout 90 $M -x HPCCL_NET_SLICE=$sl -n 2 tests/scripts/nccl_hostid.sh python3 -m hpccl.cli.perf $c --mem cuda \
        -b 256K -e 64M -f 4 --check --compare nccl --json "$OUT/slice_${sl}_${c}_r$round.json" 2>&1 \
        | grep -a -v "NCCL INFO\|share this node\|^#  \|^# all\|^# hpccl\|^# comm\|^#$" || rc=1
    done
  done
done
for c in reduce_scatter broadcast; do
  echo "=== HPCCL_NET_SLICE=64K, $c (correctness) ($(date -u +%T))"
  timeout 90 $M -x HPCCL_NET_SLICE=64K -n 2 tests/scripts/nccl_hostid.sh python3 -m hpccl.cli.perf $c --mem cuda \
    -b 8 -e 16M -f 8 --check 2>&1 | grep -a -E "wrong|^ +[0-9]" | awk '{print $1, $6, $NF}' | tr '\n' ';' ; echo
done
echo "=== quick GPU matrix at split:1, 2 ranks, HPCCL_NET_SLICE=64K ($(date -u +%T))"
timeout ${T_MATRIX:-170} $M -x HPCCL_NET_SLICE=64K -x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1 -n 2 python3 -m pytest tests/gpu -q -x \
  -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory" 2>&1 | grep -a -E "passed|failed|FAILED|Error" | sort | uniq -c || rc=1
echo "=== done rc=$rc ($(date -u +%T))"; exit $rc
