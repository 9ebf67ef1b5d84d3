#!/usr/bin/env bash
# Check hpccl's Spack repo with a real Spack: repo add, info, spec (concretize).
# Usage: scripts/deploy/spack-check.sh [SPEC...]   (spack from $SPACK_ROOT/bin or PATH)
# User config and caches go to a temp dir, so ~/.spack is neither read nor changed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../spack" && pwd)
if [[ -n "${SPACK_ROOT:-}" && -x "$SPACK_ROOT/bin/spack" ]]; then
    spack="$SPACK_ROOT/bin/spack"
elif command -v spack >/dev/null 2>&1; then
    spack=$(command -v spack)
else
    echo "spack-check: no spack (set SPACK_ROOT or put spack on PATH)" >&2
    exit 77
fi
if [[ $# -eq 0 ]]; then
    set -- "py-hpccl" "py-hpccl+cuda+ucx cuda_arch=90"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

unset SPACK_DISABLE_LOCAL_CONFIG
export SPACK_USER_CONFIG_PATH="$tmp/config"
export SPACK_USER_CACHE_PATH="$tmp/cache"

echo "$ spack --version"
"$spack" --version
echo "$ spack repo add $repo"
"$spack" repo add --scope=user "$repo"
echo "$ spack repo list"
"$spack" repo list
echo "$ spack info py-hpccl"
"$spack" info py-hpccl
for spec in "$@"; do
    echo "$ spack spec $spec"
    # shellcheck disable=SC2086  # a spec is several words on purpose
    "$spack" spec $spec
done
