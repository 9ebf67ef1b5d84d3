#!/usr/bin/env bash
# Set up, then run the whole test suite (it launches its own mpiexec runs at 1-4 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

exec .venv/bin/python -m pytest -ra --durations=25 "$@"
