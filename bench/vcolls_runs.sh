#!/bin/sh
# gather, scatter, all_gather_v and reduce_scatter_v against MPI at 2 and 4 ranks, on one node and with every
# rank its own emulated node (HPCCL_NODE_ID=split:1): hpccl-perf (--check, --compare mpi) and
# bench/vcolls_ab.py (planned vs one group of sends and receives vs MPI, rounds interleaved); all_gather rides along
# in the hpccl-perf runs as the compiled path's own call under the same conditions. Logs go to
# docs/perf/host/ (OUT overrides). Usage: sh bench/vcolls_runs.sh
set -e
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/perf/host}
PY=${PY:-.venv/bin/python}
MPIEXEC=${MPIEXEC:-.venv/bin/mpiexec}
stamp="$(date -u +%Y-%m-%d) $(nproc) cores, $(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg) at start"
for n in 2 4; do
  for layout in node split1; do
    env=""
    [ "$layout" = split1 ] && env="HPCCL_NODE_ID=split:1"
    f="$OUT/vcolls_vs_mpi_${layout}_np$n.txt"
    cmd="$env $MPIEXEC -n $n $PY -m hpccl.cli.perf all_gather gather scatter all_gather_v reduce_scatter_v -b 8 -e 1M -f 8 --check --compare mpi"
    { echo "# $cmd"; echo "# $stamp"; env $env $MPIEXEC -n $n $PY -m hpccl.cli.perf all_gather gather scatter all_gather_v \
        reduce_scatter_v -b 8 -e 1M -f 8 --check --compare mpi 2>&1 | grep -v "locked-memory limit"; } > "$f"
    f="$OUT/vcolls_ab_${layout}_np$n.txt"
    cmd="$env $MPIEXEC -n $n $PY bench/vcolls_ab.py --reps 7 --iters 200"
    { echo "# $cmd"; echo "# $stamp"; env $env $MPIEXEC -n $n $PY bench/vcolls_ab.py --reps 7 --iters 200 2>&1 \
        | grep -v "locked-memory limit"; } > "$f"
  done
done
