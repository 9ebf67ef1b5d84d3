#!/bin/bash
# Issue 36 on the one-GPU machine: Hugging Face accelerate on CUDA tensors with the hpccl backend, by both
# routes (hpccl.torch.init_process_group() before Accelerator(), and accelerate's own
# InitProcessGroupKwargs(backend="hpccl")), at 1 rank and at 2 ranks on one GPU under CUDA MPS, each against
# NCCL's losses in the same call. 2 ranks on one GPU: two torchrun "nodes" of one process each, so that
# accelerate's device (cuda:LOCAL_RANK) is the one GPU for both; NCCL_HOSTID per process lets NCCL run there.
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} CUDA_VISIBLE_DEVICES=0
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; LOG=$OUT/accelerate_gpu.log
python3 -c "import accelerate, torch; print('accelerate', accelerate.__version__, 'torch', torch.__version__)" | tee "$LOG"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS: started" && trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi
rc=0
one() {  # name, ranks, args...
  local name=$1 n=$2; shift 2
  echo "=== $name: $n rank(s), examples/accelerate_train.py $*" | tee -a "$LOG"
  local port=$((29600 + RANDOM % 300)) pids=()
  for ((r = 0; r < n; r++)); do
    NCCL_HOSTID=acc$r timeout 150 torchrun --nnodes=$n --node-rank=$r --nproc-per-node=1 --master-addr=127.0.0.1 \
      --master-port=$port examples/accelerate_train.py "$@" >"$OUT/$name.r$r.out" 2>"$OUT/$name.r$r.err" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || { echo "  rc != 0" | tee -a "$LOG"; tail -15 "$OUT/$name.r"*.err | tee -a "$LOG"; rc=1; }; done
  cat "$OUT/$name.r0.out" >>"$LOG"; grep -a "^backend" "$OUT/$name.r0.out"
}
for n in 1 2; do
  for route in accelerate init; do
    one "n${n}_${route}_hpccl" $n --route $route --backend hpccl
  done
  for route in accelerate init; do
    one "n${n}_${route}_nccl" $n --route $route --backend nccl
  done
  for route in accelerate init; do
    if cmp -s <(grep -a "^step" "$OUT/n${n}_${route}_hpccl.r0.out") <(grep -a "^step" "$OUT/n${n}_${route}_nccl.r0.out") \
       && [ "$(grep -ac "^step" "$OUT/n${n}_${route}_hpccl.r0.out")" = 20 ]; then
      echo "n=$n route=$route: 20 losses identical to NCCL's" | tee -a "$LOG"
    else
      echo "n=$n route=$route: losses DIFFER from NCCL's (or missing)" | tee -a "$LOG"; rc=1
    fi
  done
done
ls /dev/shm | grep -c hpccl | sed 's/^/hpccl files left in \/dev\/shm: /' | tee -a "$LOG"
echo "=== done rc=$rc" | tee -a "$LOG"; exit $rc
