#!/bin/bash
# The torch backend on the GPU machine, one call: hpccl's GPU tests of all_to_all_v, the backend script on
# CUDA tensors (every collective, stream semantics, split_group, DDP with find_unused_parameters and join(),
# FSDP2, against NCCL with one GPU per rank, gloo where ranks share a GPU) under mpirun and torchrun, torch's
# own suite (its CUDA and DDP tests), and bench/torch_bench.py --device cuda --ddp. Logs go to $OUT.
#   STAGES="tests backend torchrun suite bench"   pick stages; NP=2 ranks.
#   mps       start CUDA MPS for the stages after it (ranks sharing the GPU run at once; stopped at the end)
#   bench1    bench/torch_backends.py at world size 1 under torchrun: hpccl vs NCCL in one process, with
#             torch.profiler tables of DDP steps (issue 22's measures)
#   benchmps  bench/torch_backends.py at MPS_RANKS (2 4) ranks on one GPU, against gloo on CUDA tensors
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HPCCL_TIMEOUT=${HPCCL_TIMEOUT:-60}
export PYTHONPATH=$PWD:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}
export OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_btl=^uct
if ls .whl/torchsuite/*.whl >/dev/null 2>&1; then  # torch's test helpers for its suite (no internet there)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite .whl/torchsuite/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/tsite
fi
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
NP=${NP:-2}
STAGES=${STAGES:-tests backend torchrun suite bench}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -n $NP"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PYTHONUNBUFFERED \
         PYTHONDONTWRITEBYTECODE HPCCL_TIMEOUT PYTHONPATH HPCCL_DEBUG; do
  [ -n "${!v+x}" ] && MPIRUN="$MPIRUN -x $v"
done
rc=0
if [[ " $STAGES " == *" mps "* ]]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS: started" || { echo "MPS: could not start"; rc=1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  MPIRUN="$MPIRUN -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY"
fi
stage() { echo; echo "=== $1 ($(date -u +%T))"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
stage "machine"
nvidia-smi -L
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'cupy', cupy.__version__, 'gpus', torch.cuda.device_count())"
stage "builds: hpccl's C extensions, the torch backend's compiled path (as pip install and first use do)"
python3 setup.py -q build_ext --inplace >/tmp/build_ext.log 2>&1 && echo "C extensions: built" \
  || { echo "C extensions: not built"; tail -5 /tmp/build_ext.log; }
( time python3 -W ignore -m hpccl.torch.native ) 2>&1 | grep -a -v "^\s*$\|^user\|^sys" || rc=1
if has tests; then
  stage "hpccl GPU tests: all_to_all_v and grouped send/recv, $NP ranks"
  timeout ${T_TESTS:-120} $MPIRUN python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -k "all_to_all or send_recv" || rc=1
fi
if has backend; then
  stage "tests/scripts/torch_backend.py on CUDA tensors, $NP ranks under mpirun"
  timeout ${T_BACKEND:-200} $MPIRUN -x HPCCL_TORCH_DEVICE=cuda python3 -W ignore::FutureWarning \
    tests/scripts/torch_backend.py 2>&1 | grep -a -v "^\s*$" | tail -40 | tee "$OUT/torch_backend_cuda.log" || rc=1
  grep -q '"bad": \[\]' "$OUT/torch_backend_cuda.log" || rc=1
fi
if has torchrun; then
  stage "the same under torchrun (store bootstrap, no MPI launcher)"
  env -u OMPI_COMM_WORLD_SIZE HPCCL_TORCH_DEVICE=cuda timeout ${T_TORCHRUN:-200} python3 -W ignore::FutureWarning \
    -m torch.distributed.run --standalone --nproc-per-node=$NP tests/scripts/torch_backend.py 2>&1 \
    | grep -a "RESULT\|Error\|error" | tail -20 | tee "$OUT/torch_backend_cuda_torchrun.log" || rc=1
fi
if has suite; then
  SUITE_SELECT=${SUITE_SELECT:-cuda|CUDA|DistributedDataParallel|SyncBatchNorm|gpu}
  ngpu=$(nvidia-smi -L | wc -l)
  for b in hpccl $([ "$ngpu" -ge "$NP" ] && echo nccl); do  # NCCL refuses ranks that share a GPU
    stage "torch's suite, CUDA and DDP tests, BACKEND=$b, WORLD_SIZE=$NP"
    ids=$(grep -oE "^test_[A-Za-z0-9_]+" docs/perf/torch_suite/gloo_2ranks.txt | grep -E "$SUITE_SELECT" \
          | sed 's/^/TestHpcclBackend./')
    BACKEND=$b WORLD_SIZE=$NP TEMP_DIR=$(mktemp -d) timeout ${T_SUITE:-200} python3 tests/torch_suite/run_torch_suite.py -v \
      $ids > "$OUT/suite_$b.raw" 2>&1
    grep -a -E "^test_.*(ok|skipped .*|FAIL|ERROR)$|^Ran |^OK|^FAILED" "$OUT/suite_$b.raw" | tail -80 > "$OUT/suite_$b.txt"
    tail -3 "$OUT/suite_$b.txt"
  done
fi
if has bench; then
  stage "bench/torch_bench.py --device cuda --ddp, $NP ranks"
  timeout ${T_BENCH:-240} $MPIRUN python3 -W ignore::FutureWarning bench/torch_bench.py --device cuda --ddp \
    -b 8 -e ${BENCH_MAX:-1G} -f 4 --json "$OUT/torch_bench_cuda.json" 2>&1 | grep -a -v "^\s*$" | tee "$OUT/torch_bench_cuda.txt" || rc=1
fi
if has bench1; then
  stage "bench/torch_backends.py, world size 1 (torchrun): hpccl vs NCCL, DDP profiles"
  env -u OMPI_COMM_WORLD_SIZE timeout ${T_BENCH1:-300} python3 -W ignore -m torch.distributed.run --standalone \
    --nproc-per-node=1 bench/torch_backends.py --json "$OUT/torch_backends_1rank.json" --trace "$OUT/trace" --probe 2>&1 \
    | grep -a -v "^\s*$\|USDT\|Warning" | tee "$OUT/torch_backends_1rank.txt" || rc=1
fi
if has benchmps; then
  for n in ${MPS_RANKS:-2 4}; do
    stage "bench/torch_backends.py, $n ranks on one GPU (MPS): hpccl vs gloo on CUDA tensors"
    timeout ${T_BENCHMPS:-200} ${MPIRUN/-n $NP/-n $n} -x CUDA_VISIBLE_DEVICES=0 python3 -W ignore bench/torch_backends.py \
      --largest 1M --json "$OUT/torch_backends_${n}ranks_mps.json" 2>&1 | grep -a -v "^\s*$\|Warning" \
      | tee "$OUT/torch_backends_${n}ranks_mps.txt" || rc=1
  done
fi
stage "done rc=$rc"
exit $rc
