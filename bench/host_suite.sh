#!/usr/bin/env bash
# The host-memory measurements behind docs/PERFORMANCE.md, in one run: hpccl vs the MPI library vs
# torch gloo at 2 and 4 ranks, 8 B to 256 MiB; then every algorithm forced in turn (the data that
# bench/crossovers.py compares with the cost model's picks); then communicator creation time.
# Usage: bench/host_suite.sh [outdir]   (needs .venv from scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/perf}
mkdir -p "$out"
export PATH="$PWD/.venv/bin:$PATH"
for n in 2 4; do
  mpiexec -n $n hpccl-perf all_reduce all_gather reduce_scatter broadcast -b 8 -e 256M -f 2 --check \
    --compare mpi,gloo --json "$out/host-${n}ranks.json" --plot "$out/host-${n}ranks.png" \
    > "$out/host-${n}ranks.txt"
done
for n in 2 4; do
  mpiexec -n $n hpccl-perf all_reduce -b 8 -e 64M -f 4 --algo ring,tree,rd,dbtree,oneshot,twoshot,cma \
    --json "$out/algos-all_reduce-${n}ranks.json" > "$out/algos-all_reduce-${n}ranks.txt"
  mpiexec -n $n hpccl-perf all_gather reduce_scatter -b 64 -e 64M -f 4 --algo ring,direct,cma \
    --json "$out/algos-ag-rs-${n}ranks.json" > "$out/algos-ag-rs-${n}ranks.txt"
  mpiexec -n $n hpccl-perf broadcast -b 8 -e 64M -f 4 --algo tree,ring,direct,cma \
    --json "$out/algos-broadcast-${n}ranks.json" > "$out/algos-broadcast-${n}ranks.txt"
done
mpiexec -n 4 python bench/init_time.py > "$out/init-4ranks.txt"
