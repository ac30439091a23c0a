#!/usr/bin/env bash
# Two Ray "hosts" on this machine, for tests: the namespaces of netns-up.sh (tnd-n1 and tnd-n2
# at 10.77.1.1 and 10.77.1.2), the head node on n1 and a worker node on n2, each in its own UTS
# namespace (hostname n1 / n2) and mount namespace (a private /dev/shm). State and logs live in
# $1 (DIR/n1, DIR/n2); the head's `ray start --block` pid is in DIR/head.pid — a driver must run
# on a Ray node, so `nsenter -t "$(cat DIR/head.pid)" -m -n -u CMD` runs CMD on n1.
#   bash scripts/cluster/ray-up.sh DIR PYTHON   # PYTHON: a python with `ray` (setup-ray.sh)
# Needs root and iproute2. Tear down with scripts/cluster/ray-down.sh DIR (also after a failure).
set -euo pipefail
dir=${1:?usage: ray-up.sh DIR PYTHON}
py=${2:?usage: ray-up.sh DIR PYTHON}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
ray="$(dirname "$py")/ray"
[ -x "$ray" ] || { echo "ray-up.sh: no ray beside $py (run scripts/setup-ray.sh)" >&2; exit 1; }
bash "$(dirname "$0")/netns-up.sh"

node() {
  local i=$1
  shift
  mkdir -p "$dir/n$i"
  # nsenter --net only (see slurm-up.sh); a tmpfs /dev/shm of its own: Ray's object store and
  # any worker on the node see only this node's segments.
  unshare --uts --mount --propagation private nsenter --net="/run/netns/tnd-n$i" \
    sh -c "hostname n$i; mount -t tmpfs -o size=1g tmpfs /dev/shm; exec $ray start --block \
      --node-ip-address=10.77.1.$i --num-cpus=2 --object-store-memory=100000000 \
      --temp-dir=$dir/n$i --disable-usage-stats $*" \
    > "$dir/n$i.console" 2>&1 &
  echo $! > "$dir/n$i.pid"
}
node 1 --head --port=6379 --include-dashboard=false
cp "$dir/n1.pid" "$dir/head.pid"
head_pid=$(cat "$dir/head.pid")
on_head() { nsenter -t "$head_pid" -m -n -u "$@"; }
# The worker node joins once the head's GCS answers.
for _ in $(seq 1 150); do
  on_head "$py" -c 'import socket; socket.create_connection(("10.77.1.1", 6379), 1)' 2>/dev/null && break
  sleep 0.2
done
node 2 --address=10.77.1.1:6379
deadline=$(( $(date +%s) + 150 ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  for i in 1 2; do
    kill -0 "$(cat "$dir/n$i.pid")" 2>/dev/null \
      || { echo "ray-up.sh: the Ray node on n$i exited:" >&2; tail -n 20 "$dir/n$i.console" >&2; exit 1; }
  done
  n=$(on_head "$py" -c 'import ray; ray.init(address="10.77.1.1:6379", logging_level="ERROR", log_to_driver=False); print(sum(1 for x in ray.nodes() if x["Alive"]))' 2>/dev/null || echo 0)
  if [ "$n" = 2 ]; then
    echo "ray-up.sh: 2 nodes alive (head n1 10.77.1.1, worker n2 10.77.1.2)"
    exit 0
  fi
  sleep 0.5
done
echo "ray-up.sh: the two Ray nodes were not up within 150 s (consoles and logs in $dir)" >&2
for i in 1 2; do tail -n 20 "$dir/n$i.console" >&2 || true; done
exit 1
