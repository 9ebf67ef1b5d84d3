#!/bin/bash
# Issue 32's checks on the one-GPU machine, in one call (under CUDA MPS): the quick GPU matrix at 2, 4 and 8
# ranks with the synchronisation chosen automatically, a foreign kernel that never ends, SIGKILL / SIGSTOP of
# every rank position of 2 nodes x 2 and 3 nodes x 2 (HPCCL_NODE_ID=split:2) on GPU buffers, and where the
# stream-synchronised protocol's time goes (bench/sync_probe.py). Logs go to $OUT.
#   STAGES="matrix hog kill probe"   RANKS="2 4 8"   KILL_K (pytest -k of the kill stage)
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1 UCX_WARN_UNUSED_ENV_VARS=n OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_btl=^uct
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}
python3 setup.py -q build_ext --inplace >/tmp/build_ext.log 2>&1 && echo "native parts: built" || tail -5 /tmp/build_ext.log
python3 -c "import hpccl.host.hotpath as h, hpccl.transport.engine as e; print('hot path', h.available())"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log CUDA_VISIBLE_DEVICES=0
if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then  # not already started by the caller
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS: started" && trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi
M="mpirun --allow-run-as-root --oversubscribe --bind-to none"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PYTHONUNBUFFERED PYTHONPATH \
         CUDA_MPS_PIPE_DIRECTORY CUDA_VISIBLE_DEVICES UCX_WARN_UNUSED_ENV_VARS CUPY_CACHE_DIR; do
  [ -n "${!v+x}" ] && M="$M -x $v"
done
STAGES=${STAGES:-matrix hog kill probe}
has() { [[ " $STAGES " == *" $1 "* ]]; }
rc=0
if has matrix; then
  for n in ${RANKS:-2 4 8}; do
    echo "=== quick GPU matrix, $n ranks on one GPU ($(date -u +%T))"
    timeout ${T_MATRIX:-200} $M -x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1 -n $n python3 -m pytest tests/gpu -q -x \
      -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory" 2>&1 | grep -a -E "passed|failed|FAILED|Error|SKIP" | sort | uniq -c || rc=1
  done
fi
if has hog; then
  echo "=== a foreign kernel that never ends, 2 ranks ($(date -u +%T))"
  timeout 120 $M -n 2 python3 -m pytest tests/gpu/test_coexist.py -q -x -s -p no:cacheprovider --color=no -k never_ends 2>&1 \
    | grep -a -E "passed|failed|Error|coexist\]" || rc=1
fi
if has kill; then
  echo "=== SIGKILL / SIGSTOP at every position, 2 and 3 nodes x 2 ranks, GPU buffers ($(date -u +%T))"
  HPCCL_TEST_HIER_BUF=cupy timeout ${T_KILL:-300} python3 -m pytest tests/test_failures.py -q -p no:cacheprovider --color=no \
    -rs -s -k "${KILL_K:-hier_dead or hier_stopped}" 2>&1 | tee "$OUT/kill_full.log" | grep -a -E "passed|failed|FAILED|Error|ranks, rank|stopped|assert" | tail -40 || rc=1
fi
if has probe; then
  echo "=== where the stream-synchronised protocol's time goes, 2 ranks ($(date -u +%T))"
  timeout 150 $M -x HPCCL_TIMEOUT=60 -n 2 python3 bench/sync_probe.py "$OUT/sync_probe_2.json" 2>&1 | grep -a -v "^\s*$" || rc=1
fi
echo "=== done rc=$rc ($(date -u +%T))"
exit $rc
