#!/bin/bash
# Where the time of a large GPU all_reduce across nodes goes (issue 33), on the one-GPU machine: 2 ranks as
# 2 nodes (HPCCL_NODE_ID=split:1) under MPS, hpccl-perf all_reduce 4-64 MiB with every result checked:
#   host memory over the engine (the wire alone: no staging), UCX's default transports and tcp only;
#   GPU memory with UCX's default transports and tcp only, and slices of 1 MiB (default), 4 MiB, whole.
# NCCL on its sockets (NCCL_HOSTID per rank) in the GPU rows. First the engine alone (bench/engine_bw.py);
# ENGINE_ONLY=1 stops there. Output: $OUT/net_bw_probe.log.
SPLIT_LOG=net_bw_probe.log source "$(dirname "$0")/split_env.sh"
PERF="tests/scripts/nccl_hostid.sh python3 -m hpccl.cli.perf all_reduce -b 4M -e 64M -f 4 --check"
QUIET="NCCL INFO\|share this node\|^#  \|^# all\|^# hpccl\|^# comm\|^#$\|Avg bus\|Out of bounds"
rc=0
for tls in default tcp,self; do
  E=""; [ $tls != default ] && E="-x UCX_TLS=$tls"
  echo "=== the engine alone (bench/engine_bw.py), UCX_TLS=$tls ($(date -u +%T))"
  for l in ${LANES:-1}; do
    timeout 60 $M $E -n 2 python3 bench/engine_bw.py --mb 16 --lanes $l 2>&1 | grep -a "GB/s" || rc=1
  done
done
[ -n "$ENGINE_ONLY" ] && { echo "=== done rc=$rc ($(date -u +%T))"; exit $rc; }
for tls in default tcp,self; do
  E=""; [ $tls != default ] && E="-x UCX_TLS=$tls"
  echo "=== host memory, UCX_TLS=$tls ($(date -u +%T))"
  timeout 100 $M $E -n 2 $PERF --mem host 2>&1 | grep -a -v "$QUIET" || rc=1
  for sl in 1M 4M 0; do
    echo "=== GPU memory, UCX_TLS=$tls, HPCCL_NET_SLICE=$sl, vs NCCL sockets ($(date -u +%T))"
    timeout 100 $M $E -x HPCCL_NET_SLICE=$sl -n 2 $PERF --mem cuda --compare nccl 2>&1 | grep -a -v "$QUIET" || rc=1
  done
done
echo "=== done rc=$rc ($(date -u +%T))"; exit $rc
