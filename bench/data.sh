#!/usr/bin/env bash
# Runs bench_data (docs/bench.md): one process, one CPU device. Case wait: time the loop waits
# in dt_dataset_next for a slow source, prefetching against not; case read: a record file
# through a dataset against a plain read() of the same file.
# Results on stdout as key=value lines; build output on stderr.
#   bench/data.sh [--cases wait,read] [--mib N] [--reps N] [--steps N] [--source-ms MS]
#                 [--step-ms MS] [--dir DIR] [--quick] [--device cpu|gpu] [--floats N]
# --device gpu runs the wait case on a one-GPU mesh (DT_GPU=sim bench/run data --device gpu).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(--reps 3 --steps 30 --mib 16); shift ;;
    -h|--help) echo "usage: bench/data.sh [--cases wait,read] [--mib N] [--reps N] [--steps N] [--source-ms MS] [--step-ms MS] [--dir DIR] [--quick] [--device cpu|gpu] [--floats N]" >&2; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/data.sh bench_data
load "bench/run data start"
"$exe" ${args[@]+"${args[@]}"}
