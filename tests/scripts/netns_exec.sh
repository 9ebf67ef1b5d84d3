#!/bin/sh
# Run "$@" as if on its own host: inside the network namespace of this MPI rank's host and a private UTS
# namespace whose hostname is the host's name (so hpccl's hostname-based node detection sees separate
# nodes). Host index = world rank / NETNS_RANKS_PER_HOST; namespaces are ${NETNS_PREFIX}h<index>.
# The PMI connection is an inherited file descriptor, so the rank still reaches its launcher.
set -eu
rank=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-}}
if [ -z "$rank" ]; then
  echo "netns_exec.sh: no PMI_RANK / OMPI_COMM_WORLD_RANK: start me under mpiexec" >&2
  exit 2
fi
host="${NETNS_PREFIX:?}h$((rank / ${NETNS_RANKS_PER_HOST:-1}))"
# shellcheck disable=SC2016  # $0/$@ expand in the inner sh, on purpose
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
