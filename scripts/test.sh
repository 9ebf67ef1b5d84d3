#!/usr/bin/env bash
# Set up, then run the whole test suite (it launches its own mpiexec runs at 1-4 ranks).
#   bash scripts/test.sh --quick [pytest args]   the quick tier instead: every subsystem once, under 5 minutes
#                                                 on a 2-core machine (tests/conftest.py QUICK, marker "quick")
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "scripts/test.sh: set-up took ${SECONDS} s" >&2
export PATH="$PWD/.venv/bin:$PATH"

if [ "${1:-}" = --quick ]; then
  shift
  set -- -m quick "$@"
fi
exec .venv/bin/python -m pytest -ra --durations=25 "$@"
