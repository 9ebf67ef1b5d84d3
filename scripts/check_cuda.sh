#!/bin/bash
# Compile every cuda/*.cu with nvcc for sm_80 and sm_90, every template instantiation included, with
# compiler warnings as errors. Register spills are reported (a count per arch), not fatal: a few 8-byte
# types' rarely used instantiations spill a few bytes. CI runs this on a CPU machine (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "check_cuda: $NVCC not found" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for arch in ${CUDA_ARCHS:-80 90}; do
  for f in cuda/*.cu; do
    out="$tmp/$(basename "$f" .cu)_sm$arch.cubin"
    if "$NVCC" -std=c++17 -arch=sm_$arch -cubin -DHPCCL_INSTANTIATE_ALL -Werror all-warnings \
         -Xptxas -v -o "$out" "$f" 2>"$tmp/log"; then
      echo "ok   $f sm_$arch ($(grep -E -c '[1-9][0-9]* bytes spill stores' "$tmp/log" || true) kernels with register spills)"
    else
      cat "$tmp/log" >&2
      echo "FAIL $f sm_$arch" >&2
      status=1
    fi
  done
done
exit $status
