#!/usr/bin/env bash
# A Slurm cluster on the hosts of tests/multihost/mh.sh: `mh.sh 2 slurm_cluster.sh CMD...`
# starts munged (a key made here, its socket in a directory of this run), slurmctld on host 1
# and one slurmd per host from Debian's packages, with a slurm.conf generated for these hosts
# (proctrack/linuxproc, task/none, no cgroups, root as SlurmUser and SlurmdUser), waits until
# every node is idle, then runs CMD with SLURM_CONF exported and SLURM_DIR (the directory).
# Stops every daemon and removes the directory when CMD ends, fails or is killed (mh.sh then
# also kills whatever is left inside the hosts and deletes them). Exits 77 with the reason
# where Slurm or munge is missing or does not start.
set -u
skip() { echo "slurm_cluster.sh: skipping: $*" >&2; exit 77; }
for tool in munged mungekey slurmctld slurmd srun sbatch salloc sinfo scontrol; do
  command -v "$tool" >/dev/null || skip "$tool not found (Debian's slurmctld slurmd slurm-client munge)"
done
[ -n "${MH_HOSTS:-}" ] || { echo "slurm_cluster.sh: run it under tests/multihost/mh.sh" >&2; exit 2; }
read -r -a hosts <<<"$MH_HOSTS"
SLURM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/slurm.XXXXXX")
export SLURM_DIR SLURM_CONF=$SLURM_DIR/slurm.conf
pids=()
stop() {
  trap - EXIT INT TERM HUP
  [ -n "${child:-}" ] && kill -9 "$child" 2>/dev/null
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  rm -rf "$SLURM_DIR"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

d=$SLURM_DIR
mkdir -p "$d/state" "$d/munge"
chmod 700 "$d/munge"
mungekey --create --keyfile="$d/munge/munge.key" 2>"$d/mungekey.log" ||
  { cat "$d/mungekey.log" >&2; skip "mungekey could not make a key"; }
# munged inside host 1 (killed with it); its socket is a path, which every host's namespace
# reaches (the file system is shared).
"$MH_INHOST" "${hosts[0]}" munged -F --force --socket="$d/munge/munge.sock" \
  --key-file="$d/munge/munge.key" --pid-file="$d/munge/munged.pid" \
  --seed-file="$d/munge/munged.seed" --log-file="$d/munge/munged.log" 2>/dev/null &
pids+=($!)

{
  echo "ClusterName=dtlaunch"
  echo "SlurmctldHost=${hosts[0]}($MH_SUBNET.1)"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$d/munge/munge.sock"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "StateSaveLocation=$d/state"
  echo "SlurmdSpoolDir=$d/spool-%n"
  echo "SlurmctldPidFile=$d/slurmctld.pid"
  echo "SlurmdPidFile=$d/slurmd-%n.pid"
  echo "SlurmctldLogFile=$d/slurmctld.log"
  echo "SlurmdLogFile=$d/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SwitchType=switch/none"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "SchedulerType=sched/builtin"
  echo "SelectType=select/linear"
  echo "SlurmdParameters=config_overrides"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "SlurmctldTimeout=30"
  echo "SlurmdTimeout=30"
  echo "InactiveLimit=0"
  echo "KillWait=2"
  echo "MinJobAge=2"
  echo "SlurmctldDebug=info"
  echo "SlurmdDebug=info"
  i=0
  for h in "${hosts[@]}"; do
    i=$((i + 1))
    echo "NodeName=$h NodeAddr=$MH_SUBNET.$i CPUs=${SLURM_CPUS:-2} State=UNKNOWN"
  done
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$SLURM_CONF"

for _ in $(seq 50); do [ -S "$d/munge/munge.sock" ] && break; sleep 0.1; done
[ -S "$d/munge/munge.sock" ] || { cat "$d/munge/munged.log" >&2; skip "munged did not start"; }

"$MH_INHOST" "${hosts[0]}" slurmctld -D -i -f "$SLURM_CONF" >"$d/slurmctld.out" 2>&1 &
pids+=($!)
# The hosts share /tmp, where each node's PMIx plugin would make the same directory for a
# step (/tmp/spmix_appdir_UID_JOB.STEP: "File exists" on the second node). So each slurmd gets
# its own copy of the configuration directory (the same slurm.conf, so the same hash) with an
# mpi.conf naming a PMIx directory of its own.
for h in "${hosts[@]}"; do
  mkdir -p "$d/conf-$h" "$d/pmix-$h" "$d/spool-$h"
  cp "$SLURM_CONF" "$d/conf-$h/slurm.conf"
  echo "PMIxCliTmpDirBase=$d/pmix-$h" >"$d/conf-$h/mpi.conf"
  "$MH_INHOST" "$h" env SLURM_CONF="$d/conf-$h/slurm.conf" slurmd -D -N "$h" \
    -f "$d/conf-$h/slurm.conf" >"$d/slurmd-$h.out" 2>&1 &
  pids+=($!)
done
ok=0
for _ in $(seq 150); do
  idle=$("$MH_INHOST" "${hosts[0]}" sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [ "$idle" = "${#hosts[@]}" ] && { ok=1; break; }
  sleep 0.2
done
if [ $ok = 0 ]; then
  "$MH_INHOST" "${hosts[0]}" sinfo -N >&2
  tail -n 20 "$d"/*.log "$d"/*.out >&2
  skip "the Slurm daemons did not bring ${#hosts[@]} nodes up within 30 s"
fi
"$@" &
child=$!
wait "$child"
exit $?
