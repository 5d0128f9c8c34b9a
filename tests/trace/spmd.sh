#!/bin/sh
# trace_<mode>-<transport>: runs tests/trace/trace_spmd.c's MODE (skip, mismatch, kill) with 2
# processes, first recording only, then with DT_CHECK_COLLECTIVES=1, and checks that no client
# ended its call with DT_OK, that `dtensor trace` on the records written gives the expected
# one-line diagnosis, and that the check names both calls (or the lost client).
# Usage: spmd.sh MPIEXEC TRACE_SPMD DTENSOR MODE
mpiexec=$1 exe=$2 tool=$3 mode=$4
dir=$(mktemp -d)
log=$dir/log
fail=0
expect() {  # $1: text; $2: pattern (grep -E)
  echo "$1" | grep -Eq "$2" || { echo "FAIL: expected /$2/ in: $1"; fail=1; }
}
run() {  # $1: record dir; $2: 1 if a client may end with DT_OK; the rest: extra environment
  rec=$1 may_ok=$2
  shift 2
  # stderr apart: Open MPI's messages could land in the middle of a TRACE_RESULT line.
  env "$@" DT_TRACE_DIR="$rec" timeout 100 "$mpiexec" -n 2 "$exe" "$mode" > "$log" 2> "$log.err"
  echo "mpiexec exited $?"
  cat "$log" "$log.err"
  n=$(grep -c '^TRACE_RESULT' "$log")
  # kill: client 0 reports only if it timed out before mpiexec ended it (after client 1 died).
  [ "$mode" = kill ] && want=0 || want=2
  [ "$n" -ge "$want" ] || { echo "FAIL: $n client(s) reported, expected $want"; fail=1; }
  [ "$mode" = kill ] && [ "$n" -ge 1 ] &&
    expect "$(grep '^TRACE_RESULT client=0' "$log")" "status=DT_ERR_TIMEOUT .*lost client\(s\) 1 "
  if [ "$may_ok" = 0 ] && grep '^TRACE_RESULT' "$log" | grep -q 'status=DT_OK'; then
    echo "FAIL: a client ended the call with DT_OK"; fail=1
  fi
}
call3="group 0-1 seq 3"
rel="relayout f32\[64,64\] sharding_specs:x,unsharded ->"

# Without the check too, no client ends a mismatched call with DT_OK (issue 45: the mpi
# transport's lines agree on their collectives before the data).
run "$dir/rec" 0
out=$("$tool" trace "$dir/rec")
echo "--- dtensor trace:"; echo "$out"
first=$(echo "$out" | head -n 1)
case $mode in
  skip) expect "$first" "^$call3: two different calls: rank 0 $rel sharding_specs:unsharded,x; rank 1 barrier 'after'" ;;
  mismatch) expect "$first" "^$call3: two different calls: rank 0 $rel sharding_specs:unsharded,unsharded; rank 1 $rel sharding_specs:unsharded,x" ;;
  kill) expect "$first" "^$call3: rank\(s\) 1 never entered it \(rank\(s\) 0 entered barrier 'kill' on mesh 'm' \(2 devices\)\)"
        expect "$out" "rank 1: fatal signal 15" ;;
esac

run "$dir/rec-check" 0 DT_CHECK_COLLECTIVES=1
case $mode in
  skip|mismatch)
    for c in 0 1; do
      line=$(grep "^TRACE_RESULT client=$c" "$log")
      if [ $mode = skip ]; then other="client 1 called barrier 'after'"; else
        other="client 1 called $rel sharding_specs:unsharded,x"; fi
      expect "$line" "status=DT_ERR_STATE .*collective check \(seq 3 on group 0-1\): client 0 called $rel sharding_specs:unsharded,[ux].* but $other"
    done ;;
  kill) [ "$n" -ge 1 ] && expect "$(grep '^TRACE_RESULT client=0' "$log")" "collective check of barrier \(seq 3 on group 0-1\)" ;;
esac
first=$("$tool" trace "$dir/rec-check" | head -n 1)
echo "--- dtensor trace (check on): $first"
case $mode in
  skip|mismatch) expect "$first" "^$call3: two different calls" ;;
  kill) expect "$first" "^$call3: rank\(s\) 1 never entered it \(rank\(s\) 0 entered barrier 'kill'" ;;
esac
rm -rf "$dir"
exit $fail
