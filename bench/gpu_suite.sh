#!/bin/bash
# The GPU machine's one call: topology, GPU tests (2 ranks on 2 GPUs, then 4 ranks sharing 2 GPUs),
# hpccl vs NCCL benchmark, overlap example. Logs and JSON go to $OUT (docs/perf/ keeps them).
#   SUITE="topo tests2 tests4 bench overlap"  pick stages;  BENCH_ARGS="--sweep"  extra bench flags
# Measured on 2x H200 (docs/perf/gpu_suite.log): tests2 72 s, tests4 12 s, bench 32 s, overlap 3 s; the
# stage time limits (T_*) add up to under the device tool's 10-minute call.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HPCCL_TIMEOUT=${HPCCL_TIMEOUT:-60}
export PYTHONPATH=$PWD:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
SUITE=${SUITE:-topo tests2 tests4 bench perf overlap}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PYTHONUNBUFFERED \
         PYTHONDONTWRITEBYTECODE HPCCL_TIMEOUT PYTHONPATH HPCCL_ALGO HPCCL_CUDA_BLOCKS HPCCL_DEBUG; do
  [ -n "${!v+x}" ] && MPIRUN="$MPIRUN -x $v"
done
rc=0
stage() { echo; echo "=== $1 ($(date -u +%T))"; }
has() { [[ " $SUITE " == *" $1 "* ]]; }

if has topo; then
  stage topo
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvidia-smi topo -m
  python3 -c "import cupy, torch, mpi4py; print('cupy', cupy.__version__, 'torch', torch.__version__, 'mpi4py', mpi4py.__version__); from cupy.cuda import nccl; print('nccl', nccl.get_version())"
  python3 -m hpccl.topology.nvml
fi
if has tests2; then
  stage "tests: 2 ranks, 2 GPUs"
  timeout ${T_TESTS2:-200} $MPIRUN -n 2 python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no ${PYTEST_ARGS:-} || rc=1
fi
if has tests4; then
  stage "tests: 4 ranks sharing 2 GPUs (quick matrix)"
  HPCCL_TEST_QUICK=1 timeout ${T_TESTS4:-100} $MPIRUN -x HPCCL_TEST_QUICK=1 -n 4 python3 -m pytest tests/gpu -q -x \
    -p no:cacheprovider --color=no -k "not timeout and not host_memory" ${PYTEST_ARGS:-} || rc=1
fi
if has bench; then
  stage "bench: hpccl vs NCCL"
  timeout ${T_BENCH:-180} $MPIRUN -n 2 python3 bench/gpu_bench.py --json "$OUT/bench.json" ${BENCH_ARGS:-} || rc=1
fi
if has perf; then
  stage "hpccl-perf --mem cuda --compare nccl"
  timeout ${T_PERF:-150} $MPIRUN -n 2 python3 -m hpccl.cli.perf all_reduce all_gather reduce_scatter broadcast \
    --mem cuda -b 8 -e 256M -f 8 --check --compare nccl --json "$OUT/perf_cuda.json" || rc=1
fi
if has overlap; then
  stage "overlap example"
  timeout ${T_OVERLAP:-45} $MPIRUN -n 2 python3 examples/overlap.py --json "$OUT/overlap.json" || rc=1
fi
stage "done rc=$rc"
exit $rc
