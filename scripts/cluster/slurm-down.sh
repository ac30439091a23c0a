#!/usr/bin/env bash
# Stops what scripts/cluster/slurm-up.sh DIR started and removes its namespaces and bridge;
# safe to run after a partial start.
dir=${1:?usage: slurm-down.sh DIR}
for f in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid; do
  [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
done
for _ in $(seq 1 50); do
  pgrep -f "slurm(ctld|d) .*$dir" >/dev/null || break
  sleep 0.1
done
pkill -9 -f "slurm(ctld|d) .*$dir" 2>/dev/null
bash "$(dirname "$0")/netns-down.sh"
