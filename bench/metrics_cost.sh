#!/bin/bash
# The cost of Prometheus metrics per call on the GPU machine (16 cores: quieter than the 2-core CI-class
# machine), in one device call: bench/metrics_cost.py (off / off2 / on side by side in one run) at 2 ranks on
# one node and at 2 emulated nodes (HPCCL_NODE_ID=split:1, the compiled path across nodes over the engine),
# then bench/net_step_cost.py at 2 emulated nodes on one GPU under MPS, alternately with metrics off and on
# (ROUNDS times each; separate processes, same warm machine). Carry the libucx 1.20.1 wheel in .whl/.
#   bash bench/metrics_cost.sh    (logs into $OUT)
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HPCCL_TIMEOUT=60
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace >/tmp/build_ext.log 2>&1 || tail -20 /tmp/build_ext.log
export OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_btl=^uct UCX_WARN_UNUSED_ENV_VARS=n
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -c "import platform, prometheus_client, cupy; print('python', platform.python_version(), 'prometheus_client',
prometheus_client.__version__, 'cupy', cupy.__version__)"
echo "cpus $(nproc): $(lscpu | grep -m1 'Model name' | sed 's/.*: *//')"; date -u
MPIRUN="mpirun --allow-run-as-root -x PYTHONPATH -x PYTHONUNBUFFERED -x HPCCL_TIMEOUT"
echo "=== host, one node, 2 ranks (bound to cores)"
timeout 240 $MPIRUN --bind-to core -n 2 python3 bench/metrics_cost.py ${HOST_ARGS:-}
echo "=== host, 2 emulated nodes x 1 rank (HPCCL_NODE_ID=split:1, bound to cores)"
timeout 240 $MPIRUN --bind-to core -x HPCCL_NODE_ID=split:1 -n 2 python3 bench/metrics_cost.py ${HOST_ARGS:-}
[ "${GPU:-1}" = 1 ] || exit 0
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS: started"
trap 'echo quit | nvidia-cuda-mps-control' EXIT
GPURUN="$MPIRUN --oversubscribe --bind-to none -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY -x HPCCL_NODE_ID=split:1 -x CUDA_VISIBLE_DEVICES=0"
rm -rf /tmp/hpccl-metrics && mkdir -p /tmp/hpccl-metrics
for round in $(seq ${ROUNDS:-2}); do
  for m in off on; do
    echo "=== GPU all_reduce with a network step, 2 emulated nodes on one GPU, metrics $m (round $round)"
    extra=""; [ $m = on ] && extra="-x HPCCL_METRICS_FILE=/tmp/hpccl-metrics -x HPCCL_METRICS_INTERVAL=1"
    timeout 120 $GPURUN $extra -n 2 python3 bench/net_step_cost.py --iters ${ITERS:-200} --sizes ${SIZES:-8,1024,65536}
  done
done
ls -l /tmp/hpccl-metrics; grep -h 'hpccl_calls_total.*replayed' /tmp/hpccl-metrics/*.prom | head -4
date -u
