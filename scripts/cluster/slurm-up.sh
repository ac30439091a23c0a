#!/usr/bin/env bash
# Two Slurm "hosts" on this machine, for tests: the namespaces of netns-up.sh (tnd-n1 and
# tnd-n2 at 10.77.1.1 and 10.77.1.2; this namespace is the login node, 10.77.1.254), each
# slurmd in its own UTS namespace (hostname n1 / n2) and mount namespace (a private /dev/shm),
# slurmctld and munged here. The configuration lives in $1 (SLURM_CONF=$1/slurm.conf); nothing
# is written under /etc. Needs root, iproute2, slurm-wlm and munge (.ci/run installs them).
# Tear down with scripts/cluster/slurm-down.sh $1 (also after a failure).
set -euo pipefail
dir=${1:?usage: slurm-up.sh DIR}
mkdir -p "$dir"/{state,log} "$dir"/spool/n1 "$dir"/spool/n2
dir=$(cd "$dir" && pwd)
export SLURM_CONF=$dir/slurm.conf

bash "$(dirname "$0")/netns-up.sh"

cat > "$SLURM_CONF" <<CONF
ClusterName=tandem-ci
SlurmctldHost=$(hostname)(10.77.1.254)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeAddr=10.77.1.1 CPUs=2 RealMemory=8000 State=UNKNOWN
NodeName=n2 NodeAddr=10.77.1.2 CPUs=2 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP
CONF

mkdir -p /run/munge
chown munge:munge /run/munge
if ! pgrep -x munged >/dev/null; then
  # --force: a socket left by a munged that did not stop cleanly is not a running one.
  runuser -u munge -- /usr/sbin/munged --force
fi
/usr/sbin/slurmctld -f "$SLURM_CONF"
for i in 1 2; do
  # nsenter --net, not `ip netns exec`: the latter remounts /sys and hides the cgroup mounts
  # slurmd initialises.
  unshare --uts --mount --propagation private nsenter --net="/run/netns/tnd-n$i" \
    sh -c "hostname n$i; mount -t tmpfs -o size=1g tmpfs /dev/shm; exec /usr/sbin/slurmd -D -f $SLURM_CONF -N n$i" \
    > "$dir/log/slurmd-n$i.console" 2>&1 &
  echo $! > "$dir/slurmd-n$i.launcher.pid"
done
for _ in $(seq 1 150); do
  if [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" = idle ]; then
    sinfo -N
    exit 0
  fi
  sleep 0.2
done
echo "slurm-up.sh: the nodes did not become idle within 30 s (logs in $dir/log)" >&2
sinfo -N >&2 || true
exit 1
