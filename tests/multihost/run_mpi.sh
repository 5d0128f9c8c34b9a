#!/bin/sh
# Inside tests/multihost/mh.sh: runs an MPI test program on the hosts (2 processes per host, 2
# CPU devices each) and checks that its traffic went over the inter-host link.
set -u
before=$("$MH_BYTES" "${MH_PREFIX}2")
DT_CPU_DEVICES=2 "$MH_MPIRUN" -n 4 "$@" || exit $?
after=$("$MH_BYTES" "${MH_PREFIX}2")
if [ $((after - before)) -lt 4096 ]; then
  echo "run_mpi.sh: only $((after - before)) bytes crossed host 2's link" >&2
  exit 1
fi
echo "run_mpi.sh: $((after - before)) bytes over host 2's link"
