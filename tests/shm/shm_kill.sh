#!/bin/sh
# runtime_shm_kill: runs test_shm_kill (2 processes, one killed with SIGKILL) and checks that
# the survivor named the killed client within DT_COMM_TIMEOUT, that no shared-memory name of
# the job's processes is left in /dev/shm, and that a name a killed process left before (made
# here for a process that has ended) was removed by the next start.
# Usage: shm_kill.sh MPIEXEC TEST_SHM_KILL
mpiexec=$1
exe=$2
uid=$(id -u)
sh -c 'exit 0' &
dead=$!
wait $dead
stale=/dev/shm/dtshm.$uid.$dead.0
: > "$stale" || { echo "cannot write /dev/shm: skipped"; exit 77; }
log=$(mktemp)
DT_COMM_TIMEOUT=${DT_COMM_TIMEOUT:-5} timeout 120 "$mpiexec" -n 2 "$exe" > "$log" 2>&1
echo "mpiexec exited $? (a killed client ends the job with an error)"
cat "$log"
fail=0
grep -q "^SHM_KILL_OK" "$log" || { echo "FAIL: the survivor did not name the killed client"; fail=1; }
[ "$(grep -c '^SHM_KILL_PID' "$log")" -eq 2 ] || { echo "FAIL: not 2 processes started"; fail=1; }
for pid in $(sed -n 's/^SHM_KILL_PID //p' "$log"); do
  if ls /dev/shm/dtshm.$uid.$pid.* >/dev/null 2>&1; then
    echo "FAIL: a segment name of process $pid is left"; fail=1
  fi
done
[ ! -e "$stale" ] || { echo "FAIL: the stale name $stale was not removed"; rm -f "$stale"; fail=1; }
rm -f "$log"
exit $fail
