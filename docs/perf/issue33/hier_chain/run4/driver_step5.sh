# step 5 of this run (steps 1-4 were the same shape: bench/issue32_gpu.sh stages and the $M2 steps of ../run3/driver.sh)
pkill -9 -x python3; pkill -9 -x mpirun
export OUT=${OUT:-/tmp/o}; mkdir -p $OUT
T0=$(date +%s); LIMIT=${LIMIT:-240}
st() { left=$((LIMIT - $(date +%s) + T0)); echo "=== $(date +%T) left=${left}s $2"; [ $left -ge $1 ]; }
source bench/split_env.sh
M1=${M/-x HPCCL_NODE_ID=split:1 /}
Q="-x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1"
summ() { tee -a $OUT/pytest_raw.log | grep -a -E "passed|failed|FAILED|Error" | sort | uniq -c; }
st 120 "one-node 2" && timeout 130 $M1 -n 2 $Q python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory and not held_engine" | summ
st 60 "one-node 8" && timeout 80 $M1 -n 8 $Q python3 -m pytest tests/gpu/test_cuda.py -q -x -p no:cacheprovider --color=no -rs -k "replay or stream_order or back_to_back or test_all_reduce_dtype" | summ
st 0 done
