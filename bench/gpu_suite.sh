#!/bin/bash
# The GPU machine's one call: topology, GPU tests (2 ranks on 2 GPUs, then 4 ranks sharing 2 GPUs),
# the same tests on emulated multi-node layouts (2 nodes x 1 GPU, 2 nodes x 2 ranks; UCX between
# "nodes", default transports and TCP + cuda_copy), hpccl vs NCCL benchmarks (NCCL forced onto its
# network transport for the 2-node runs), overlap example. Logs and JSON go to $OUT (docs/perf/).
#   SUITE="topo tests2 tests4 tests2n tests4n testsTcp bench perf perfnet overlap launch registered"  pick stages;
#   BENCH_ARGS="--sweep"  extra bench flags. Carry the libucx 1.20.1 wheel in .whl/ for the engine.
# Ranks sharing ONE GPU under CUDA MPS (the one-GPU machine; issue 20), on by default:
#   mps        start the MPS control daemon for the stages after it (stopped at the end)
#   probe      bench/residency_probe.py at 4 and 8 ranks: kernel occupancy, the failing patterns sized by
#              hpccl, then with the old 64-block sizing (the deadlock, HPCCL_TIMEOUT=10)
#   quick1gpu  the quick GPU matrix at SHARED_RANKS (2 4 8) ranks on one GPU, REPEAT (1) times each
#   full1gpu   the full GPU matrix at SHARED_RANKS, FULL_REPEAT (1) times each
#   split4     the quick matrix (SPLIT_QUICK=0: the full one) as 2 nodes x 2 ranks (HPCCL_NODE_ID=split:2,
#              UCX), REPEAT times
#   campaign   bench/gpu_campaign.py at SHARED_RANKS: CAMPAIGN_CASES (1000) random cases each
#   engine     the network engine's staged GPU steps: quick matrix at split:1 with ENGINE_RANKS (2 4) ranks,
#              bench/net_step_cost.py, hpccl-perf vs NCCL sockets (NCCL_HOSTID per rank) per collective
# Measured on 2x H200 (docs/perf/gpu_suite.log): tests2 72 s, tests4 12 s, bench 32 s, overlap 3 s; the
# stage time limits (T_*) add up to under the device tool's 10-minute call. On one H200 under MPS:
# quick matrix 23/26/35 s at 2/4/8 ranks, full 25/35/50 s, split:2
# quick 25 s and full 48 s, campaign of 2000 cases 45/54/70 s, probe ~16 s per rank count: the default
# SUITE (REPEAT=1) fits one call; REPEAT=3 (the issue-20 acceptance runs) and "mps full1gpu split4" with
# SPLIT_QUICK=0 take a call each.
set -o pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HPCCL_TIMEOUT=${HPCCL_TIMEOUT:-60}
if ls .whl/*.whl >/dev/null 2>&1; then  # libucx 1.20.1 for the native network engine (no internet there)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}
# the compiled hot path (hpccl/csrc/_hotpath.c) for this machine's Python, as pip install would build it
python3 setup.py -q build_ext --inplace >/tmp/build_ext.log 2>&1 && echo "hot path: built" \
  || { echo "hot path: not built"; tail -5 /tmp/build_ext.log; }
# Debian's Open MPI would load the system UCX beside the wheel's: keep MPI on its own transports
export OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_btl=^uct UCX_WARN_UNUSED_ENV_VARS=n
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
SUITE=${SUITE:-topo mps probe quick1gpu split4 campaign}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PYTHONUNBUFFERED \
         PYTHONDONTWRITEBYTECODE HPCCL_TIMEOUT PYTHONPATH HPCCL_ALGO HPCCL_CUDA_BLOCKS HPCCL_DEBUG \
         UCX_WARN_UNUSED_ENV_VARS PYTEST_ADDOPTS HPCCL_TEST_QUICK HPCCL_HOT_SIZE HPCCL_COMPILED_LAUNCH; do
  [ -n "${!v+x}" ] && MPIRUN="$MPIRUN -x $v"
done
rc=0
stage() { echo; echo "=== $1 ($(date -u +%T))"; }
has() { [[ " $SUITE " == *" $1 "* ]]; }
SUMMARY=""
# one pytest run of the GPU matrix: label, time limit, -k expression, mpirun arguments...; its result line
# goes to SUMMARY
matrix() {
  local label=$1 limit=$2 kexpr=$3; shift 3
  local t0=$SECONDS log=/tmp/matrix.log
  timeout "$limit" $MPIRUN "$@" python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs \
    -k "$kexpr" ${PYTEST_ARGS:-} 2>&1 | tee $log
  local r=${PIPESTATUS[0]}
  local last; last=$(grep -a -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" $log | tail -1)
  [ "$r" = 0 ] || rc=1
  SUMMARY="$SUMMARY
$label: rc=$r, $((SECONDS - t0)) s: ${last:-no pytest summary}"
}
if has topo; then
  stage topo
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvidia-smi topo -m
  python3 -c "import cupy, torch, mpi4py; print('cupy', cupy.__version__, 'torch', torch.__version__, 'mpi4py', mpi4py.__version__); from cupy.cuda import nccl; print('nccl', nccl.get_version())"
  python3 -m hpccl.topology.nvml
fi
if has mps; then
  stage "CUDA MPS control daemon (ranks sharing a GPU run at once)"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "MPS: started" || { echo "MPS: could not start"; rc=1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  MPIRUN="$MPIRUN -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY"
fi
SHARED_RANKS=${SHARED_RANKS:-2 4 8}
if has probe; then
  for n in 4 8; do
    stage "residency probe: $n ranks on one GPU"
    timeout ${T_PROBE:-120} $MPIRUN -x HPCCL_TIMEOUT=10 -x CUDA_VISIBLE_DEVICES=0 -n $n python3 bench/residency_probe.py || rc=1
  done
fi
for kind in quick full; do  # stages quick1gpu and full1gpu: the same matrix, HPCCL_TEST_QUICK=1 or 0
  has ${kind}1gpu || continue
  if [ $kind = quick ]; then q=1 reps=${REPEAT:-1} limit=${T_QUICK:-300}; else q=0 reps=${FULL_REPEAT:-1} limit=${T_FULL:-500}; fi
  for n in $SHARED_RANKS; do
    for k in $(seq $reps); do
      stage "$kind GPU matrix: $n ranks on one GPU, run $k"
      matrix "$kind, $n ranks on one GPU, run $k" $limit "not timeout and not host_memory" \
        -x HPCCL_TEST_QUICK=$q -x CUDA_VISIBLE_DEVICES=0 -n $n
    done
  done
done
if has split4; then
  for k in $(seq ${REPEAT:-1}); do
    q=${SPLIT_QUICK:-1}; kind=$([ "$q" = 1 ] && echo quick || echo full)
    stage "$kind GPU matrix: 2 nodes x 2 ranks (HPCCL_NODE_ID=split:2, UCX), run $k"
    matrix "$kind, split:2 x 4 ranks, run $k" ${T_SPLIT:-300} "not timeout" -x HPCCL_NODE_ID=split:2 \
      -x HPCCL_TEST_QUICK=$q -x CUDA_VISIBLE_DEVICES=0 -n 4
  done
fi
if has campaign; then
  for n in $SHARED_RANKS; do
    stage "correctness campaign: $n ranks on one GPU, ${CAMPAIGN_CASES:-1000} cases"
    t0=$SECONDS
    timeout ${T_CAMPAIGN:-400} $MPIRUN -x CUDA_VISIBLE_DEVICES=0 -n $n python3 bench/gpu_campaign.py \
      --cases ${CAMPAIGN_CASES:-1000} --json "$OUT/campaign_${n}ranks.json" 2>&1 | tee /tmp/campaign.log
    r=${PIPESTATUS[0]}; [ "$r" = 0 ] || rc=1
    SUMMARY="$SUMMARY
campaign, $n ranks on one GPU: rc=$r, $((SECONDS - t0)) s: $(grep -a "cases per rank run" /tmp/campaign.log | tail -1)"
  done
fi
if has coexist; then
  # issue 32: independent jobs sharing the GPU (bench/gpu_coexist.sh: LAYOUTS, REPEAT, CALLS)
  stage "jobs sharing one GPU: ${LAYOUTS:-2x4 3x2 2x3}, ${REPEAT:-1} run(s) each"
  t0=$SECONDS
  timeout ${T_COEXIST:-500} env OUT="$OUT" EXTRA="${MPIRUN#mpirun --allow-run-as-root --oversubscribe --bind-to none}" \
    bash bench/gpu_coexist.sh 2>&1 | tee /tmp/coexist.log
  r=${PIPESTATUS[0]}; [ "$r" = 0 ] || rc=1
  SUMMARY="$SUMMARY
jobs sharing one GPU: rc=$r, $((SECONDS - t0)) s
$(grep -a -A2 "^layout" /tmp/coexist.log)"
fi
if has syncab; then
  # issue 32: the stream-synchronised protocol against spinning kernels, same GPU, same run
  for n in $SHARED_RANKS; do
    for mode in spin stream; do
      stage "A/B: HPCCL_CUDA_SYNC=$mode, $n ranks on one GPU"
      timeout ${T_AB:-120} $MPIRUN -x HPCCL_CUDA_SYNC=$mode -x CUDA_VISIBLE_DEVICES=0 -n $n python3 -m hpccl.cli.perf \
        all_reduce all_gather -b 8 -e 64M -f 8 --mem cuda --check --json "$OUT/syncab_${mode}_${n}.json" || rc=1
    done
  done
fi

if has launch; then
  stage "host cost of a repeated GPU all_reduce: compiled launch vs ctypes (2 ranks)"
  timeout ${T_LAUNCH:-120} $MPIRUN -n 2 python3 bench/launch_cost.py || rc=1
fi
if has registered; then
  stage "registered (zero-copy, copy-engine) vs staged GPU collectives (2 ranks)"
  timeout ${T_REGISTERED:-200} $MPIRUN -n 2 python3 bench/registered.py ${REG_ARGS:-} --json "$OUT/registered.json" || rc=1
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
if has tests2n; then
  stage "tests: 2 nodes x 1 GPU (HPCCL_NODE_ID=split:1), UCX default transports"
  timeout ${T_TESTS2N:-240} $MPIRUN -x HPCCL_NODE_ID=split:1 -n 2 tests/scripts/gpu_per_rank.sh python3 -m pytest tests/gpu -q -x \
    -p no:cacheprovider --color=no -rs ${PYTEST_ARGS:-} || rc=1
fi
if has tests4n; then
  stage "tests: 2 nodes x 2 ranks on 2 GPUs (HPCCL_NODE_ID=split:2, quick matrix)"
  timeout ${T_TESTS4N:-240} $MPIRUN -x HPCCL_NODE_ID=split:2 -x HPCCL_TEST_QUICK=1 -n 4 python3 -m pytest tests/gpu \
    -q -x -p no:cacheprovider --color=no -rs ${PYTEST_ARGS:-} || rc=1
fi
if has testsTcp; then
  stage "tests: 2 nodes x 1 GPU over UCX_TLS=tcp,cuda_copy,self (network-like, quick matrix)"
  timeout ${T_TESTSTCP:-200} $MPIRUN -x HPCCL_NODE_ID=split:1 -x HPCCL_TEST_QUICK=1 -x UCX_TLS=tcp,cuda_copy,self -n 2 tests/scripts/gpu_per_rank.sh \
    python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs -k "not timeout" ${PYTEST_ARGS:-} || rc=1
fi
if has engine; then
  # the native network engine's staged GPU steps (issue 21): correctness at 2 and 4 "nodes" on one GPU, the
  # host time of a call, and hpccl vs NCCL's socket transport on the same two-node layout in the same run
  for n in ${ENGINE_RANKS:-2 4}; do
    stage "network engine: quick GPU matrix, $n nodes x 1 rank on one GPU (HPCCL_NODE_ID=split:1)"
    matrix "engine quick, split:1 x $n ranks" ${T_ENGINE:-300} "not timeout" -x HPCCL_NODE_ID=split:1 \
      -x HPCCL_TEST_QUICK=1 -x CUDA_VISIBLE_DEVICES=0 -n $n
  done
  stage "network engine: host time of a GPU call with a network step (2 nodes x 1 rank)"
  timeout 120 $MPIRUN -x HPCCL_NODE_ID=split:1 -x CUDA_VISIBLE_DEVICES=0 -n 2 python3 bench/net_step_cost.py \
    --json "$OUT/engine_host_cost.json" || rc=1
  NET="-x HPCCL_NODE_ID=split:1 -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_IB_DISABLE=1 -x CUDA_VISIBLE_DEVICES=0"
  NET="$NET -x NCCL_SOCKET_IFNAME=lo -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET"
  for c in ${ENGINE_COLLS:-all_reduce all_gather reduce_scatter broadcast}; do
    stage "network engine: hpccl-perf $c, 2 nodes x 1 rank on one GPU, vs NCCL sockets"
    timeout ${T_ENGINE_PERF:-150} $MPIRUN $NET -n 2 tests/scripts/nccl_hostid.sh python3 -m hpccl.cli.perf $c \
      --mem cuda -b 8 -e ${ENGINE_MAX:-64M} -f 8 --check --compare nccl --json "$OUT/engine_$c.json" \
      > /tmp/perfeng.log 2>&1 || rc=1
    grep -a -m2 "Using network\|NET/Socket : Using" /tmp/perfeng.log
    grep -a -v "NCCL INFO" /tmp/perfeng.log
  done
fi
if has perfnet; then
  # NCCL on its network transport (sockets) for the same 2-node layout, timed in the same run as hpccl;
  # NCCL_DEBUG=INFO shows which transport it used (the "Using network" line is kept, the rest dropped)
  NET="-x HPCCL_NODE_ID=split:1 -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_IB_DISABLE=1"
  NET="$NET -x NCCL_SOCKET_IFNAME=lo -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET"
  for tls in ${PERFNET_TLS:-tcp,cuda_copy,self default}; do
    stage "hpccl-perf all_reduce, 2 nodes x 1 GPU, UCX_TLS=$tls, vs NCCL over its network transport"
    x=""; [ "$tls" != default ] && x="-x UCX_TLS=$tls"
    timeout ${T_PERFNET:-200} $MPIRUN $NET $x -n 2 tests/scripts/gpu_per_rank.sh python3 -m hpccl.cli.perf all_reduce --mem cuda -b 8 \
      -e ${PERFNET_MAX:-256M} -f 4 --check --compare nccl --json "$OUT/perf_net_${tls%%,*}.json" > /tmp/perfnet.log 2>&1 || rc=1
    grep -a -m2 "Using network\|NET/Socket : Using" /tmp/perfnet.log
    grep -a -v "NCCL INFO" /tmp/perfnet.log
  done
  [ -n "${PERFNET_NO_INTRA:-}" ] || stage "hpccl-perf all_reduce, one node, 2 GPUs (the pure intra-node path)"
  [ -n "${PERFNET_NO_INTRA:-}" ] || timeout ${T_PERFNET:-200} $MPIRUN -n 2 python3 -m hpccl.cli.perf all_reduce --mem cuda -b 1M -e 256M -f 4 --check \
    --json "$OUT/perf_intra.json" || rc=1
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
[ -n "$SUMMARY" ] && { stage "summary"; echo "$SUMMARY"; }
stage "done rc=$rc"
exit $rc
