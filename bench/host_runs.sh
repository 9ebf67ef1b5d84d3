#!/usr/bin/env bash
# Issue 23's host targets, measured: RUNS (3) side-by-side sweeps of every collective against the MPI
# library at 2 ranks (8 B-16 MiB) and the README's main job (4 ranks), then the single-copy floor, then
# bench/runs_table.py's table of every run's ratio, median and spread. Host buffers: ALLOC=hpccl (default,
# comm.alloc_host, the same buffers for MPI) or ALLOC=numpy (each rank's own heap). Usage: bench/host_runs.sh [outdir]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/perf/host_runs/$(date -u +%F)}
mkdir -p "$out"
export PATH="$PWD/.venv/bin:$PATH"
for i in $(seq 1 "${RUNS:-3}"); do
  for n in 2 4; do
    mpiexec -n $n hpccl-perf all -b 8 -e 16M -f 4 --check --compare mpi --host-alloc "${ALLOC:-hpccl}" --json "$out/np${n}-run$i.json" \
      > "$out/np${n}-run$i.txt"
  done
done
python bench/copy_floor.py --procs 2 --json "$out/floor.json" 131072 524288 2097152 8388608 33554432 > "$out/floor.txt"
for n in 2 4; do
  python bench/runs_table.py --floor "$out/floor.json" "$out"/np${n}-run*.json > "$out/np${n}-table.md"
done
