#!/bin/bash
# hpccl's TCP segment size (HPCCL_UCX_TCP_SEG) A/B between 2 network-namespace hosts on the CPU machine: for
# each of RUNS rounds and each of SEGS, one message one way (bench/net_oneway_probe.py), one way / each way /
# all_gather (bench/net_pair.py) and the host collectives (bench/net_host.py), each against MPICH in the same
# job. HPCCL_UCX_TCP_SEG changes hpccl's UCX context only, so MPICH's numbers are its own defaults throughout.
#   bash bench/tcp_seg_ab.sh > out.txt     SEGS="512k 128k"  RUNS=3  SIZES=262144,524288,1048576,4194304,16777216
cd "$(dirname "$0")/.." || exit 1
SIZES=${SIZES:-262144,524288,1048576,4194304,16777216}
for r in $(seq "${RUNS:-3}"); do
  for s in ${SEGS:-512k 128k}; do
    echo "## HPCCL_UCX_TCP_SEG=$s run $r ($(date -u +%T))"
    HPCCL_UCX_TCP_SEG=$s python3 bench/net_oneway_probe.py --cases eng,mpi --sizes "$SIZES" 2>&1 | grep " B "
    HPCCL_UCX_TCP_SEG=$s python3 bench/net_pair.py --sizes "$SIZES" --reps 9 2>&1 | grep " B "
    HPCCL_UCX_TCP_SEG=$s python3 bench/net_host.py --hosts 2 --reps 9 2>&1 | grep "engine/MPI"
  done
done
