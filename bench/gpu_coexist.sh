#!/bin/bash
# Jobs sharing ONE GPU (issue 32), under CUDA MPS when the caller started it (bench/gpu_suite.sh stage
# "coexist"): for each layout JOBSxRANKS, the jobs one after the other, then all at once; each job is
# bench/gpu_jobs.py (random collectives, every result checked) under its own mpirun. Prints per run the
# serial and concurrent wall times, their ratio, and every job's calls / wrong / error.
#   LAYOUTS="2x4 3x2 2x3"  REPEAT=3  CALLS=600  T_JOB=120  EXTRA="-x HPCCL_CUDA_SYNC=spin"
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -x CUDA_VISIBLE_DEVICES=0 ${EXTRA:-}"
rc=0
job() {  # job number, ranks, log
  timeout "${T_JOB:-120}" $MPIRUN -n "$2" python3 bench/gpu_jobs.py --calls "${CALLS:-600}" --seed "$((100 + $1))" \
    >"$3" 2>&1
}
summary() {  # logs...: calls, wrong and errors over every rank of every job
  python3 bench/gpu_jobs.py --summarize "$@"
}
for lay in ${LAYOUTS:-2x4 3x2 2x3}; do
  J=${lay%x*}; K=${lay#*x}
  for rep in $(seq "${REPEAT:-1}"); do
    t0=$(date +%s.%N)
    for j in $(seq "$J"); do job "$j" "$K" "/tmp/coexist_serial_$j.log" || rc=1; done
    t1=$(date +%s.%N)
    pids=""
    for j in $(seq "$J"); do job "$j" "$K" "/tmp/coexist_par_$j.log" & pids="$pids $!"; done
    for p in $pids; do wait "$p" || rc=1; done
    t2=$(date +%s.%N)
    ser=$(python3 -c "print(f'{$t1 - $t0:.1f}')"); par=$(python3 -c "print(f'{$t2 - $t1:.1f}')")
    ratio=$(python3 -c "print(f'{($t2 - $t1) / ($t1 - $t0):.2f}')")
    echo "layout ${J} jobs x ${K} ranks, run $rep: one after the other ${ser} s, at once ${par} s (ratio $ratio)"
    echo "  serial:     $(summary /tmp/coexist_serial_*.log)"
    echo "  concurrent: $(summary /tmp/coexist_par_*.log)"
    cat /tmp/coexist_par_*.log >>"$OUT/coexist_${lay}_run${rep}.log"
    rm -f /tmp/coexist_serial_*.log /tmp/coexist_par_*.log
  done
done
exit $rc
