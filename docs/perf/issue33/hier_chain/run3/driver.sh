pkill -9 -x python3; pkill -9 -x mpirun
export OUT=/tmp/o; mkdir -p /tmp/o
T0=$(date +%s); LIMIT=${LIMIT:-540}
source bench/split_env.sh
exec >> /tmp/o/run.log 2>&1
M2=${M/split:1/split:2}; M4=${M/split:1/split:4}; M1=${M/-x HPCCL_NODE_ID=split:1 /}
summ() { tee -a /tmp/o/pytest_raw.log | grep -a -E "passed|failed|FAILED|Error|SKIPPED" | sort | uniq -c; }
Q="-x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1"
python3 -W ignore -m hpccl.torch.native
# st NEED label: run the next step only if NEED seconds are left
st() { left=$((LIMIT - $(date +%s) + T0)); echo "=== $(date +%T) left=${left}s $2"; [ $left -ge $1 ]; }
if st 100 "torch_backend split:2x4"; then
  timeout 150 $M2 -n 4 -x HPCCL_TORCH_DEVICE=cuda python3 tests/scripts/torch_backend.py 2>&1 | tee /tmp/o/tb24.log | grep -a -E "RESULT|Error" | head -20
  if [ "$(grep -c '"bad": \[\]' /tmp/o/tb24.log)" = 4 ]; then echo TB24 OK; elif st 100 diag; then
    timeout 120 $M2 -n 4 -x HPCCL_TORCH_DEVICE=cuda python3 diag_arm.py 2>&1 | tee /tmp/o/diag.log | grep -a -E "\[arm r0\]|RESULT" | head -40; fi
fi
st 60 "hier_replay split:2x4" && timeout 90 $M2 -n 4 python3 tests/scripts/hier_replay.py 2>&1 | tee /tmp/o/hr.log | grep -a -E "RESULT|Error" | head
st 150 "matrix split:2x4" && timeout 200 $M2 -n 4 $Q python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory and not held_engine" | summ
st 120 "one-node 2" && timeout 180 $M1 -n 2 $Q python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory and not held_engine" | summ
for n in 4 8; do st 80 "one-node $n" && timeout 100 $M1 -n $n $Q python3 -m pytest tests/gpu/test_cuda.py -q -x -p no:cacheprovider --color=no -rs -k "replay or stream_order or back_to_back or test_all_reduce_dtype" | summ; done
st 90 "kill 2x2" && HPCCL_TEST_HIER_BUF=cupy timeout 120 python3 -m pytest tests/test_failures.py -q -p no:cacheprovider --color=no -k "hier_dead_rank and 4-" 2>&1 | tail -3
st 0 done
