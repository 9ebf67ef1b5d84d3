#!/usr/bin/env bash
# Create .venv with hpccl (editable), an MPI (the PyPI mpich wheel), UCX (ucxx), the test tools and the
# baselines.
# Usage: scripts/setup.sh            (idempotent; re-run after pulling)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[mpich,test,bench,ucx]"
# torch (CPU) is only a baseline (gloo) and a buffer type in the tests; a local wheel makes this quick.
if [ "${HPCCL_SKIP_TORCH:-0}" != "1" ]; then
  .venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q torch
fi
