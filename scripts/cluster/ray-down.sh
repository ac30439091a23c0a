#!/usr/bin/env bash
# Stops the Ray nodes of scripts/cluster/ray-up.sh DIR (every process of their sessions) and
# removes the namespaces and bridge; safe to run after a partial start.
dir=${1:?usage: ray-down.sh DIR}
for f in "$dir"/n2.pid "$dir"/n1.pid; do
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
done
# `ray start --block` stops its node's processes when it ends; anything of the sessions still
# running after 10 s is killed.
for _ in $(seq 1 100); do
  pgrep -f "$dir/n[12]" >/dev/null || break
  sleep 0.1
done
pkill -9 -f "$dir/n[12]" 2>/dev/null
bash "$(dirname "$0")/netns-down.sh"
