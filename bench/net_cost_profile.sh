#!/bin/bash
# Where the calling thread's host time of a replayed network call goes (issue 33): rank 0 of
# bench/net_step_cost.py at one size under py-spy --native (py-spy's wheel carried in .whl/, installed by
# split_env.sh into /tmp/site), on the one-GPU machine as 2 nodes under MPS. Writes py-spy's collapsed stacks to
# $OUT/profile_<bytes>.txt and prints the native frames under the C replay (nr_run) by their share of its samples.
#   SIZES="16777216"  ITERS=3000  RATE=2000
SPLIT_LOG=net_cost_profile.log source "$(dirname "$0")/split_env.sh"
SPY=/tmp/site/bin/py-spy
[ -x "$SPY" ] || { echo "py-spy is not in /tmp/site/bin: carry its wheel in .whl/"; exit 1; }
rc=0
for n in ${SIZES:-16777216}; do
  echo "=== py-spy --native on rank 0, all_reduce of $n bytes, ${ITERS:-3000} calls ($(date -u +%T))"
  timeout 150 $M -n 2 bash -c "if [ \"\$OMPI_COMM_WORLD_RANK\" = 0 ]; then exec $SPY record --native \
    -r ${RATE:-2000} -f raw -o $OUT/profile_$n.txt -- python3 bench/net_step_cost.py --sizes $n --iters ${ITERS:-3000}; \
    else exec python3 bench/net_step_cost.py --sizes $n --iters ${ITERS:-3000}; fi" 2>&1 \
    | grep -a -v "share this node" || rc=1
  python3 - "$OUT/profile_$n.txt" <<'EOF' || rc=1
import collections, sys
under, total = collections.Counter(), 0
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    frames = stack.split(";")
    at = [i for i, f in enumerate(frames) if f.split(" (")[0].strip() in ("NetProgram_run", "nr_run")]
    if not at:
        continue
    total += int(count)
    below = frames[at[-1] + 1:at[-1] + 3] or ["(the replay itself)"]
    under[" <- ".join(f.split(" (")[0] for f in reversed(below))] += int(count)
print(f"samples in the C replay (nr_run, which NetProgram.run and the front door call): {total}")
for k, c in under.most_common(25):
    print(f"{100 * c / max(total, 1):6.1f}%  {k}")
EOF
done
exit $rc
