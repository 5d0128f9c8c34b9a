#!/usr/bin/env bash
# bench/run multihost [--mib 16,64] [--reps N] [--rate 1gbit] [--delay 0.2ms]: relayout
# across 2 hosts x 2 processes (network namespaces, tests/multihost/mh.sh) against MPI's
# all-reduce, reduce-scatter and all-gather on MPI_COMM_WORLD and on the cross-host
# communicator, the links shaped to --rate (and --delay where the kernel has netem). Needs
# root with network-namespace rights. docs/bench.md, docs/multihost.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mib=16,64 reps=3 rate=1gbit delay=0.2ms
while [ $# -gt 0 ]; do
  case "$1" in
    --mib) mib=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    *) echo "usage: bench/run multihost [--mib 16,64] [--reps N] [--rate R] [--delay D]" >&2
       exit 2 ;;
  esac
done
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/run bench_multihost
load "bench/run multihost start"
export MH_BENCH_EXE=$exe MH_BENCH_ARGS="--mib $mib --reps $reps" MH_RATE=$rate MH_DELAY=$delay
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$root/tests/multihost/mh.sh" 2 sh -c '
  for h in $MH_HOSTS; do "$MH_SHAPE" "$h" rate "$MH_RATE" delay "$MH_DELAY" | sed "s/^/# /"; done
  # shellcheck disable=SC2086
  "$MH_MPIRUN" -n 4 --map-by ppr:2:node -x DT_CPU_DEVICES=1 "$MH_BENCH_EXE" $MH_BENCH_ARGS'
status=$?
load "bench/run multihost end"
exit $status
