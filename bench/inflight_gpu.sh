#!/bin/bash
# Ranks killed or stopped with GPU calls in flight, on the one-GPU machine under MPS (docs/RELIABILITY.md).
# STAGES (default "probe table"):
#   probe     bench/mps_kill_probe.py: what a killed MPS client's pending work of each kind does to the others
#   repro     the table's split:1 x 3 victim 1 case with REPRO_ENV (default: the spinning network kernels on)
#   table     bench/inflight_campaign.py --table (TABLE_ENV: extra NAME=value for the ranks; TABLE_PICK: only
#             these cases, comma-separated indexes)
#   campaign  bench/inflight_campaign.py --cases CASES --seed SEED --parallel PAR --budget BUDGET
#   gputest   the GPU tests of the network steps' waits (GPUTEST_K: stream operations where the GPU may be
#             shared; add kernel_wait_timeout for the spinning kernels' backstops) at split:1 x 2
#   perf      bench/net_replay_ab.sh's perf stage: all_reduce, stream waits (auto under MPS) against spinning
#             kernels (HPCCL_CUDA_SYNC=spin) against NCCL on its sockets, 2 ranks as 2 nodes
# END (seconds, default 560): the campaign gets what is left of it after the stages before it, less 20 s.
SPLIT_LOG=inflight_gpu.log source "$(dirname "$0")/split_env.sh"
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
python3 -c "from hpccl.kernels import Kernels; Kernels.for_device(0).load(${PRELOAD:-['float32','float64','int32','float16','int64','uint8']})" \
  || echo "kernel load failed"
echo "=== kernels loaded at ${SECONDS}s"
rc=0
envs() { local o=""; for e in $1; do o="$o --env $e"; done; echo "$o"; }
for stage in ${STAGES:-probe table}; do
  echo "=== $stage ($(date -u +%T))"
  case $stage in
  probe) timeout 120 python3 bench/mps_kill_probe.py ${PROBE_CASES:-} 2>&1 | grep -a -E "^(CLEAN|FAULT)" || rc=1 ;;
  repro) timeout ${T_REPRO:-60} python3 bench/inflight_campaign.py --table --pick 3 --log $OUT/repro.jsonl --logdir /tmp/repro \
           $(envs "${REPRO_ENV:-HPCCL_NET_FUSED_SIZE=16K}") 2>&1 | grep -a -E "^(PASS|FAIL|SUMMARY)" | cut -c1-1500 || rc=1 ;;
  table) timeout ${T_TABLE:-400} python3 bench/inflight_campaign.py --table ${TABLE_PICK:+--pick $TABLE_PICK} \
           --parallel ${PAR:-2} --log $OUT/table.jsonl \
           --logdir /tmp/table $(envs "${TABLE_ENV:-}") 2>&1 | grep -a -E "^(FAIL|SUMMARY)" | cut -c1-1500 || rc=1 ;;
  campaign) left=$(( ${END:-560} - SECONDS - 20 )); [ $left -gt 30 ] || { echo "no time left"; continue; }
           timeout $left python3 bench/inflight_campaign.py --cases ${CASES:-200} --seed ${SEED:-1} \
           --parallel ${PAR:-3} --budget $(( left - 45 )) --log $OUT/campaign.jsonl --logdir /tmp/camp $(envs "${CAMP_ENV:-}") \
           2>&1 | grep -a -E "^(FAIL|SUMMARY)" | cut -c1-1500 || rc=1 ;;
  gputest) timeout 200 $M -x HPCCL_TIMEOUT=60 -n 2 python3 -m pytest tests/gpu/test_cuda_failures.py -q -p no:cacheprovider \
           --color=no -rs -k "${GPUTEST_K:-stream_operations_where}" 2>&1 \
           | grep -a -E "passed|failed|FAILED|Error|SKIPPED|assert" | sort | uniq -c | cut -c1-400 || rc=1 ;;
  perf) STAGES=perf VARIANTS="HPCCL_CUDA_SYNC=auto HPCCL_CUDA_SYNC=spin" ROUNDS=1 FACTOR=${FACTOR:-8} \
           timeout ${T_PERF:-200} bash bench/net_replay_ab.sh 2>&1 | grep -a -E "^ *[0-9]+ |^===|ratio|hpccl/" | cut -c1-200 || rc=1 ;;
  esac
done
ls /dev/shm | grep -c hpccl | sed 's/^/hpccl files in \/dev\/shm: /'
tar czf $OUT/rank_logs.tgz /tmp/repro /tmp/table /tmp/camp 2>/dev/null
exit $rc
