#!/usr/bin/env bash
# The main job: set up, then a 4-rank hpccl-perf sweep of every collective with --check, side by side
# with the MPI library. Host memory (no GPU needed). Exit status is non-zero if any result is wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
mpiexec -n "${NRANKS:-4}" hpccl-perf all -b 8 -e "${MAXBYTES:-16M}" -f 4 --check --compare mpi \
  --json "${OUT:-perf-quickstart}.json"
