#!/bin/bash
# HPCCL_NET_SLICE A/B on the one-GPU machine: 2 ranks as 2 nodes (HPCCL_NODE_ID=split:1) on one GPU under MPS,
# hpccl-perf vs NCCL sockets (NCCL_HOSTID per rank), slice sizes interleaved over ROUNDS rounds, every result
# checked; then the other collectives and the quick GPU matrix at split:1 with a small slice (correctness).
source "$(dirname "$0")/split_env.sh"
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
