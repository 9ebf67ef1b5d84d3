#!/bin/bash
# Repeat the 3-host UCX test (each rank destroys its communicator as soon as its last call returns) under two
# busy-loop CPU hogs, and count failures: how often a destroy resets a connection a peer still reads.
#   bash bench/destroy_stress.sh [TREE] [N]     TREE: a built checkout (default: this one), N runs (default 60)
set -u
TREE=${1:-$(cd "$(dirname "$0")/.." && pwd)}
N=${2:-60}
cd "$TREE"
( while :; do :; done ) & H1=$!
( while :; do :; done ) & H2=$!
trap 'kill $H1 $H2 2>/dev/null' EXIT
fail=0
for i in $(seq 1 "$N"); do
  out=$(PYTHONPATH=$TREE timeout 120 python3 -m pytest -q -p no:cacheprovider \
        "tests/net/test_netns_ucx.py::test_ranks_see_separate_nodes_and_talk_over_ucx[3hosts-x1]" 2>&1)
  if [ $? -ne 0 ]; then
    fail=$((fail + 1))
    echo "run $i: $(echo "$out" | grep -o 'Hpccl[A-Za-z]*Error[^"]*' | head -1 | cut -c1-160)"
  fi
done
echo "tree $(git -C "$TREE" rev-parse --short HEAD): $fail of $N runs failed"
