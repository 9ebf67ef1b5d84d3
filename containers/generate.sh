#!/usr/bin/env bash
# Regenerate containers/Dockerfile and containers/hpccl.def from the hpccm recipe containers/hpccl.py.
# Usage: containers/generate.sh [--check]   (--check: exit 1 if the committed files differ)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hpccm=${HPCCM:-hpccm}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$hpccm" --recipe "$here/hpccl.py" --format docker > "$tmp/Dockerfile"
"$hpccm" --recipe "$here/hpccl.py" --format singularity --singularity-version 3.8 > "$tmp/hpccl.def"

status=0
for f in Dockerfile hpccl.def; do
    if [[ "${1:-}" == --check ]]; then
        if ! diff -u "$here/$f" "$tmp/$f"; then
            echo "containers/$f is out of date: run containers/generate.sh" >&2
            status=1
        fi
    else
        cp "$tmp/$f" "$here/$f"
        echo "wrote containers/$f"
    fi
done
exit "$status"
