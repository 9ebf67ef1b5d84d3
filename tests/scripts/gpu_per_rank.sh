#!/bin/bash
# One GPU per MPI rank (rank % GPUs), for emulated multi-node layouts where every "node" has local rank 0.
n=$(nvidia-smi -L | wc -l)
export HPCCL_CUDA_DEVICE=$(( ${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}} % (n > 0 ? n : 1) ))
exec "$@"
