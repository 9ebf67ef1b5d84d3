#!/usr/bin/env bash
# The host-memory measurements behind docs/PERFORMANCE.md, in one run: hpccl vs the MPI library vs
# torch gloo at 2 and 4 ranks, 8 B to 256 MiB, and the per-algorithm sweep that checks the crossovers.
# Usage: bench/host_suite.sh [outdir]   (needs .venv from scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/perf}
mkdir -p "$out"
export PATH="$PWD/.venv/bin:$PATH"
for n in 2 4; do
  mpiexec -n $n hpccl-perf all_reduce all_gather reduce_scatter broadcast -b 8 -e 256M -f 4 --check \
    --compare mpi,gloo --json "$out/host-${n}ranks.json" --plot "$out/host-${n}ranks.png" \
    | tee "$out/host-${n}ranks.txt"
done
mpiexec -n 4 hpccl-perf all_reduce -b 8 -e 64M -f 4 --algo ring,tree,rd,oneshot,twoshot \
  --json "$out/host-algos-4ranks.json" | tee "$out/host-algos-4ranks.txt"
mpiexec -n 4 hpccl-perf all_reduce -b 8 -e 64M -f 4 --json "$out/host-auto-4ranks.json" \
  | tee "$out/host-auto-4ranks.txt"
