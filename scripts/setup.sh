#!/usr/bin/env bash
# Create .venv with hpccl (editable), an MPI (the PyPI mpich wheel), UCX (the libucx wheel, for the native
# network engine), the test tools and the baselines.
# Usage: scripts/setup.sh            (idempotent; re-run after pulling)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[mpich,test,bench,ucx,docs]"
# torch (CPU): the gloo baseline, a buffer type, and the torch.distributed backend's tests (its own test
# suite needs expecttest and hypothesis); a local wheel makes this quick.
if [ "${HPCCL_SKIP_TORCH:-0}" != "1" ]; then
  .venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q torch
  .venv/bin/python -m pip install -q expecttest hypothesis
  # the training frameworks the tests run on hpccl (tests/test_frameworks.py), held to the torch above
  .venv/bin/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > .venv/torch-pin.txt
  .venv/bin/python -m pip install -q -c .venv/torch-pin.txt lightning accelerate \
    || echo "setup: lightning/accelerate not installed (tests/test_frameworks.py skips, naming them)"
  # the torch backend's compiled part, built now rather than by the first process group (cached; a
  # failure leaves the Python backend in charge and is not fatal here)
  .venv/bin/python -W ignore -m hpccl.torch.native || echo "setup: the torch backend's compiled part was not built"
fi
