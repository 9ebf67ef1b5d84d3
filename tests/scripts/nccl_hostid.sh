#!/bin/bash
# Each MPI rank its own "host" to NCCL (../shared/RECIPES.md "Several ranks on ONE GPU"): NCCL then uses its
# socket transport between ranks sharing one GPU, the same two-node layout hpccl gets from HPCCL_NODE_ID.
export NCCL_HOSTID=fakehost${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
exec "$@"
