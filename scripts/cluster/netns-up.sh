#!/usr/bin/env bash
# Two "hosts" on this machine for the cluster tests: network namespaces tnd-n1 and tnd-n2 on
# the bridge tnd-br (10.77.1.1 and 10.77.1.2; this namespace is the login node, 10.77.1.254).
# Leftovers of a run that died before its netns-down.sh are removed first. Needs root and
# iproute2. Used by slurm-up.sh and ray-up.sh; netns-down.sh removes them.
set -euo pipefail
for i in 1 2; do ip netns del "tnd-n$i" 2>/dev/null || true; done
ip link del tnd-br 2>/dev/null || true
ip link add tnd-br type bridge
ip addr add 10.77.1.254/24 dev tnd-br
ip link set tnd-br up
for i in 1 2; do
  ip netns add "tnd-n$i"
  ip link add "tnd-v$i" type veth peer name eth0 netns "tnd-n$i"
  ip link set "tnd-v$i" master tnd-br up
  ip -n "tnd-n$i" addr add "10.77.1.$i/24" dev eth0
  ip -n "tnd-n$i" link set eth0 up
  ip -n "tnd-n$i" link set lo up
done
