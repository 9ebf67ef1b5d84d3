#!/bin/bash
# DDP and FSDP2 steps at world size 1, hpccl against NCCL, four runs of bench/torch_backends.py: the
# models built in the usual order (hpccl's first) and with --baseline-first, twice each, to tell a step
# difference that follows the backend from one that follows allocation order. Output: $OUT/step_ab.txt.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 setup.py -q build_ext --inplace >/tmp/build_ext.log 2>&1 || tail -5 /tmp/build_ext.log
python3 -W ignore -m hpccl.torch.native
rc=0
for run in ${RUNS:-1 2}; do
  for flag in "" --baseline-first; do
    echo "=== run $run ${flag:-default order} ($(date -u +%T))"
    env -u OMPI_COMM_WORLD_SIZE python3 -W ignore -m torch.distributed.run --standalone --nproc-per-node=1 \
      bench/torch_backends.py --no-calls $flag 2>&1 | grep -a -v "^\s*$\|Warning\|warn" || rc=1
  done
done 2>&1 | tee "$OUT/step_ab.txt"
exit $rc
