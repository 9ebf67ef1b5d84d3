# the GPU call: CuPy's stream change under the quick matrix, hier_stopped with the kernels loaded first, compile times, one node at 4 and 8
pkill -9 -x python3; pkill -9 -x mpirun
export OUT=${OUT:-/tmp/o}; mkdir -p $OUT
T0=$(date +%s); LIMIT=${LIMIT:-300}
st() { left=$((LIMIT - $(date +%s) + T0)); echo "=== $(date +%T) left=${left}s $2"; [ $left -ge $1 ]; }
source bench/split_env.sh
M1=${M/-x HPCCL_NODE_ID=split:1 /}
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'from_external', hasattr(cupy.cuda.Stream, 'from_external'))"
summ() { grep -a -E "passed|failed|FAILED|Error" | sort | uniq -c; }
Q="-x HPCCL_TIMEOUT=60 -x HPCCL_TEST_QUICK=1"
st 100 "2 nodes x 1, quick matrix, warnings shown" && timeout 120 $M -n 2 $Q python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs -W always::DeprecationWarning -k "not timeout and not host_memory and not held_engine" > $OUT/1_matrix_split1.log 2>&1; summ < $OUT/1_matrix_split1.log; echo "ExternalStream warnings: $(grep -a -c 'ExternalStream is deprecated' $OUT/1_matrix_split1.log)"
st 60 "hier_stopped, GPU buffers" && STAGES=kill KILL_K='hier_stopped' T_KILL=90 bash bench/issue32_gpu.sh > $OUT/2_stopped.log 2>&1; grep -a -E "passed|failed|stopped:|assert" $OUT/2_stopped.log | tail -6
st 40 "compile times, empty cache then warm" && for c in cold warm; do
  [ $c = cold ] && export CUPY_CACHE_DIR=$(mktemp -d)
  timeout 60 python3 -c "
import time
from hpccl.kernels import Kernels, DTYPE_IDS
k = Kernels.for_device(0)
for name in ('none', 'float32', 'float64'):
    t = time.perf_counter(); k._module(None if name == 'none' else DTYPE_IDS[name]); print('$c', 'module', name, round(time.perf_counter() - t, 2), 's', flush=True)
"
done 2>&1 | tee $OUT/3_compile.log; unset CUPY_CACHE_DIR
st 60 "one node x 4, quick matrix" && timeout 100 $M1 -n 4 $Q python3 -m pytest tests/gpu -q -x -p no:cacheprovider --color=no -rs -k "not timeout and not host_memory and not held_engine" > $OUT/4_matrix_one4.log 2>&1; summ < $OUT/4_matrix_one4.log
st 40 "one node x 8, replay/stream/dtype" && timeout 60 $M1 -n 8 $Q python3 -m pytest tests/gpu/test_cuda.py -q -x -p no:cacheprovider --color=no -rs -k "replay or stream_order or back_to_back or test_all_reduce_dtype" > $OUT/5_one8.log 2>&1; summ < $OUT/5_one8.log
st 0 done
