#!/bin/bash
# HPCCL_NET_REPLAY on the one-GPU machine (issue 33): 2 ranks as 2 nodes (HPCCL_NODE_ID=split:1) on one GPU
# under MPS. STAGES (default "check cost perf"):
#   check  the quick GPU matrix at split:1 with 2 ranks, and the replay and stream-order tests at 4 and 8
#   hier   GPU tests at split:2 with 4 ranks (hier: node kernels and network steps)
#   fail   the timeout tests at split:1 (a replayed call whose peer never comes, a held engine)
#   cost   host time per call and GPU time per call (bench/net_step_cost.py) for each of COST_VARIANTS
#          (default: replays on and off); COST_ARGS: its flags (--nccl: NCCL's calls timed alike, same job)
#   perf   hpccl-perf all_reduce vs NCCL sockets (NCCL_HOSTID per rank), the VARIANTS (default: replays on
#          and off; a variant sets one variable, or several joined by commas) interleaved over ROUNDS
#          rounds, every result checked
#   node   hpccl-perf all_reduce and all_gather on ONE node (NODE_N ranks, default 4; GPU kernels, no network),
#          the VARIANTS interleaved over ROUNDS rounds, every result checked (sizes BEGIN to 64M by FACTOR,
#          defaults 8 and 8; an A/B of trees: a variant
#          PYTHONPATH=<dir>/.snap/NAME:/tmp/site,PYTHONSAFEPATH=1 runs the tree there, PYTHONSAFEPATH=1 this one)
#   colls  all_gather, reduce_scatter, broadcast vs NCCL sockets, replays on
#   torch  bench/torch_backends.py: torch.distributed on hpccl vs NCCL sockets, 2 ranks as 2 nodes
#   graph  graph capture: the capture test at split:2 x 4 and split:4 x 8 (hier), and bench/net_graph.py
#          (all_reduce eager and replayed from a graph, vs NCCL sockets) at split:1 x 2 and split:2 x 4
#          (CAPTURE_AT, GRAPH_AT: the layouts, "split:2,4 split:4,8" and "split:1,2 split:2,4"; empty: none)
# Test stages print pytest's summary lines, keep the whole output in $OUT/pytest_raw.log, and fail when a run
# printed no summary (a rank that died said nothing otherwise).
SPLIT_LOG=net_replay_ab.log source "$(dirname "$0")/split_env.sh"
PERF="tests/scripts/nccl_hostid.sh python3 -m hpccl.cli.perf"
QUIET="NCCL INFO\|share this node\|^#  \|^# all\|^# hpccl\|^# comm\|^#$"
# a variant's name in file names: tree_NAME for a tree under .snap/NAME, tree_head for this tree run as one
# (PYTHONSAFEPATH=1: the working directory's hpccl/ is not put first), else its variables
tag() { case $1 in *.snap/*) local t=${1#*.snap/}; echo "tree_${t%%[:/,]*}" ;; *PYTHONSAFEPATH*) echo tree_head ;;
        *) echo "${1#HPCCL_}" | tr =, __ ;; esac; }
# pytest's summary lines of a multi-rank run, counted; its whole output goes to $OUT/pytest_raw.log, and a run that
# printed no summary at all (a rank died, or the timeout ended it) says so
summ() {
  local f; f=$(mktemp)
  tee -a "$OUT/pytest_raw.log" > "$f"
  grep -a -E "${1:-passed|failed|FAILED|Error|SKIPPED}" "$f" | sort | uniq -c
  if ! grep -a -q -E "[0-9]+ (passed|failed)" "$f"; then
    echo "=== no pytest summary (a rank died, or the time ran out): see $OUT/pytest_raw.log"; rm -f "$f"; return 1
  fi
  rm -f "$f"
}
rc=0
for stage in ${STAGES:-check cost perf}; do
  case $stage in
  check)
    echo "=== quick GPU matrix at split:1, 2 ranks ($(date -u +%T))"
    timeout ${T_MATRIX:-200} $M -x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1 -n 2 python3 -m pytest tests/gpu -q -x \
      -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory and not held_engine" 2>&1 \
      | summ || rc=1
    for n in 4 8; do
      echo "=== replay and stream-order tests at split:1, $n ranks ($(date -u +%T))"
      timeout ${T_SUB:-150} $M -x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1 -n $n python3 -m pytest tests/gpu/test_cuda.py tests/gpu/test_cuda_streams.py -q -x \
        -p no:cacheprovider --color=no -rs -k "replay or stream_order or back_to_back or test_all_reduce_dtype" 2>&1 \
        | summ || rc=1
    done ;;
  hier)
    echo "=== hier at split:2, 4 ranks (node kernels + network steps on lanes) ($(date -u +%T))"
    timeout ${T_SUB:-150} ${M/split:1/split:2} -x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1 -n 4 python3 -m pytest \
      tests/gpu/test_cuda.py tests/gpu/test_cuda_streams.py -q -x -p no:cacheprovider --color=no -rs \
      -k "stream_order or back_to_back or test_all_reduce_dtype or test_all_gather or broadcast_reduce or graph" 2>&1 \
      | summ "passed|failed|FAILED|Error" || rc=1 ;;
  fail)
    echo "=== timeout tests at split:1, 2 ranks (a replayed call whose peer never comes) ($(date -u +%T))"
    timeout ${T_SUB:-150} $M -n 2 python3 -m pytest tests/gpu/test_cuda_failures.py -q -p no:cacheprovider --color=no -rs \
      -k "timeout or held_engine" 2>&1 | summ || rc=1 ;;
  cost)
    for v in ${COST_VARIANTS:-HPCCL_NET_REPLAY=1 HPCCL_NET_REPLAY=0}; do
      echo "=== net_step_cost, $v ($(date -u +%T))"
      timeout 120 $M -x ${v//,/ -x } -n 2 tests/scripts/nccl_hostid.sh python3 bench/net_step_cost.py $COST_ARGS \
        --json "$OUT/cost_$(tag "$v").json" 2>&1 | grep -a -v "share this node\|NCCL INFO" || rc=1
    done ;;
  node)
    for round in $(seq ${ROUNDS:-2}); do
      for v in ${VARIANTS:-HPCCL_NET_REPLAY=1}; do
        for c in all_reduce all_gather; do
          echo "=== one node, ${NODE_N:-4} ranks, round $round, $v, $c ($(date -u +%T))"
          timeout 150 ${M/-x HPCCL_NODE_ID=split:1/} -x ${v//,/ -x } -n ${NODE_N:-4} python3 -m hpccl.cli.perf $c \
            --mem cuda -b ${BEGIN:-8} -e 64M -f ${FACTOR:-8} --check \
            --json "$OUT/node_${c}_$(tag "$v")_r$round.json" 2>&1 | grep -a -v "$QUIET" || rc=1
        done
      done
    done ;;
  perf)
    for round in $(seq ${ROUNDS:-2}); do
      for v in ${VARIANTS:-HPCCL_NET_REPLAY=1 HPCCL_NET_REPLAY=0}; do
        echo "=== round $round, $v, all_reduce ($(date -u +%T))"
        timeout 150 $M -x ${v//,/ -x } -n 2 $PERF all_reduce --mem cuda -b ${BEGIN:-8} -e 64M -f ${FACTOR:-8} --check \
          --compare nccl --json "$OUT/ar_$(tag "$v")_r$round.json" 2>&1 | grep -a -v "$QUIET" || rc=1
      done
    done ;;
  colls)
    for c in all_gather reduce_scatter broadcast; do
      echo "=== HPCCL_NET_REPLAY=1, $c ($(date -u +%T))"
      timeout 150 $M -n 2 $PERF $c --mem cuda -b 8 -e 64M -f 8 --check --compare nccl 2>&1 | grep -a -v "$QUIET" || rc=1
    done ;;
  graph)
    for l in ${CAPTURE_AT-split:2,4 split:4,8}; do set -- ${l/,/ }
      echo "=== graph capture at $1, $2 ranks ($(date -u +%T))"
      timeout ${T_SUB:-150} ${M/split:1/$1} -x HPCCL_TIMEOUT=60 -n $2 python3 -m pytest tests/gpu/test_cuda_streams.py -q \
        -p no:cacheprovider --color=no -rs -k "graph_capture" 2>&1 | summ "passed|failed|FAILED|Error|SKIPPED|assert" || rc=1
    done
    for l in ${GRAPH_AT-split:1,2 split:2,4}; do set -- ${l/,/ }
      echo "=== all_reduce eager and from a graph, $1 x $2 ranks, vs NCCL sockets ($(date -u +%T))"
      timeout 150 ${M/split:1/$1} -n $2 tests/scripts/nccl_hostid.sh python3 bench/net_graph.py \
        --json "$OUT/graph_${1/:/}_$2.json" 2>&1 | grep -a -v "NCCL INFO\|share this node" || rc=1
    done ;;
  torch)
    echo "=== torch.distributed, 2 ranks as 2 nodes, hpccl vs NCCL sockets ($(date -u +%T))"
    timeout ${T_TORCH:-300} $M -x PYTHONUNBUFFERED=1 -n 2 tests/scripts/nccl_hostid.sh python3 -W ignore bench/torch_backends.py \
      --baseline nccl --train ddp --json "$OUT/torch_2nodes.json" 2>&1 | grep -a -v "^\s*$\|Warning\|warn\|NCCL INFO" || rc=1 ;;
  esac
done
echo "=== done rc=$rc ($(date -u +%T))"; exit $rc
