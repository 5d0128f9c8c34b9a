#!/usr/bin/env bash
# Runs bench_pipeline (docs/bench.md, docs/pipeline.md): builds it if missing, then for each
# process count NP runs BUILD_DIR/mpiexec -n NP with one CPU device per process (mesh pipe=NP):
# GPipe, 1F1B and interleaved 1F1B, each line with the measured bubble, bubble_theory, the
# peak activation bytes the tapes held and the step time against data parallel on the same
# devices (ref_step_s), measured in the same run.
#   bench/pipeline.sh [--np 2,4] [--micro M] [--layers L] [--width W] [--rows R] [--steps N]
#                     [--chunks V] [--quick]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/pipeline.sh [options]
  --np LIST    process counts = stages (default 2,4); one CPU device per process
  --micro M    micro-batches per step (default 8; a multiple of the stages)
  --layers L   layers of matmul + relu (default 8; a multiple of stages x chunks)
  --width W    layer width (default 256)   --rows R   rows per micro-batch (default 64)
  --steps N    timed steps after one warm-up (default 5)
  --chunks V   virtual stages per stage of the interleaved schedule (default 2)
  --quick      2 timed steps (the same as --steps 2)
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS (extra launcher args).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nps=2,4
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --micro|--layers|--width|--rows|--steps|--chunks)
      [ $# -ge 2 ] || { usage; exit 2; }; extra+=("$1" "$2"); shift 2 ;;
    --np) [ $# -ge 2 ] || { usage; exit 2; }; nps=$2; shift 2 ;;
    --quick) extra+=(--steps 2); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/pipeline.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
IFS=, read -r -a np_list <<<"$nps"
for np in "${np_list[@]}"; do
  case "$np" in
    ''|*[!0-9]*|0) echo "bench/pipeline.sh: bad process count '$np'" >&2; usage; exit 2 ;;
  esac
done

# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/pipeline.sh bench_pipeline

status=0
load "bench/run pipeline start"
for np in "${np_list[@]}"; do
  # shellcheck disable=SC2086
  DT_CPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$exe" ${extra[@]+"${extra[@]}"} ||
    status=1
done
load "bench/run pipeline end"
exit "$status"
