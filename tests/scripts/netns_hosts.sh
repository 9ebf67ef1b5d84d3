#!/bin/sh
# Make (or remove) N emulated hosts for manual runs and benchmarks, like tests/net/nethosts.py does:
#   netns_hosts.sh up N [PREFIX]    namespaces PREFIXh0..h(N-1) with 10.77.0.(i+1)/24 on "net0", joined by
#                                   a bridge in namespace PREFIXbr
#   netns_hosts.sh down N [PREFIX]  delete them (the veths go with them)
#   netns_hosts.sh stats N [PREFIX] tx/rx byte counters of each host's net0
# Then: NETNS_PREFIX=PREFIX NETNS_RANKS_PER_HOST=K mpiexec -n M tests/scripts/netns_exec.sh python ...
# Needs root. Addresses are reachable only from inside the namespaces.
set -eu
cmd=${1:?up|down|stats}; n=${2:?number of hosts}; p=${3:-hn}
case "$cmd" in
up)
  ip netns add "${p}br"
  ip -n "${p}br" link set lo up
  ip -n "${p}br" link add br0 type bridge
  ip -n "${p}br" link set br0 up
  i=0
  while [ "$i" -lt "$n" ]; do
    ip netns add "${p}h$i"
    ip link add "${p}v$i" type veth peer name "${p}b$i"
    ip link set "${p}v$i" netns "${p}h$i"
    ip link set "${p}b$i" netns "${p}br"
    ip -n "${p}h$i" link set "${p}v$i" name net0
    ip -n "${p}h$i" addr add "10.77.0.$((i + 1))/24" dev net0
    ip -n "${p}h$i" link set lo up
    ip -n "${p}h$i" link set net0 up
    ip -n "${p}br" link set "${p}b$i" master br0
    ip -n "${p}br" link set "${p}b$i" up
    i=$((i + 1))
  done ;;
down)
  i=0
  while [ "$i" -lt "$n" ]; do ip netns del "${p}h$i" 2>/dev/null || true; i=$((i + 1)); done
  ip netns del "${p}br" 2>/dev/null || true ;;
stats)
  i=0
  while [ "$i" -lt "$n" ]; do
    printf '%s ' "${p}h$i"
    ip -n "${p}h$i" -s link show dev net0 | awk '/RX:/{getline; printf "rx %s ", $1} /TX:/{getline; printf "tx %s\n", $1}'
    i=$((i + 1))
  done ;;
*) echo "usage: $0 up|down|stats N [PREFIX]" >&2; exit 2 ;;
esac
