#!/usr/bin/env bash
# Install hpccl into PREFIX as a venv and its Lmod modulefile into MODULEROOT/hpccl/<version>.lua.
# Usage: scripts/deploy/install-module.sh PREFIX [MODULEROOT] [PIP-SPEC]
#   PREFIX      e.g. /opt/hpccl/0.1.0 (created; a venv made with $PYTHON, default python3)
#   MODULEROOT  default PREFIX/share/modulefiles; then: module use MODULEROOT; module load hpccl
#   PIP-SPEC    what to pip install, default: this source tree with the mpich extra
# Set SKIP_VENV=1 to only write the modulefile for a PREFIX that is already installed.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    sed -n '2,8p' "$0" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
prefix=$1
moduleroot=${2:-$prefix/share/modulefiles}
spec=${3:-"${src}[mpich]"}
template="$src/modulefiles/hpccl/0.1.0.lua"
version=$(basename "$template" .lua)

if [[ "${SKIP_VENV:-0}" != 1 ]]; then
    "${PYTHON:-python3}" -m venv "$prefix"
    "$prefix/bin/python" -m pip install --quiet "$spec"
fi
mkdir -p "$moduleroot/hpccl"
sed "s|@PREFIX@|$prefix|g" "$template" > "$moduleroot/hpccl/$version.lua"
echo "installed: module use $moduleroot; module load hpccl/$version"
