#!/usr/bin/env bash
# Runs bench_zero (docs/bench.md): builds it if missing, then for each process count runs
# BUILD_DIR/mpiexec -n NP with one CPU device per process: memory per rank of ZeRO stages 0, 1 and 2
# against the paper's formulas for mixed-precision Adam, the step time of stages 1 and 2
# against stage 0 on the same model and ranks, interleaved in one run, and the fraction of the
# gradient reduction dt_zero_grad_ready hides behind a backward pass (case overlap), (case
# offload) stages 1 and 2 with the optimizer offloaded to the host against without, on one GPU
# device per process (DT_GPU: default cuda when nvidia-smi is there, else sim), and stage 3's
# memory and iteration time on a layered loop against stage 0 (case stage3).
# Results on stdout as key=value lines; build output and launcher messages on stderr.
#   bench/zero.sh [--params P] [--np 2,4] [--reps N] [--quick] [--allgather N]
#                 [--cases memory,speed,overlap,offload,stage3,reduce]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/zero.sh [options]
  --params P     model parameters, a multiple of 8192 (default 8388608)
  --np LIST      process counts (default 2,4); one CPU device per process
  --reps N       timed steps per stage (default 10); --quick: 3
  --allgather N  elements per all-gather chunk (default P/16)
  --cases LIST   memory,speed,overlap,offload,stage3,reduce (default all)
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS (extra launcher args).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nps=2,4
cases=memory,speed,overlap,offload,stage3,reduce
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cases) [ $# -ge 2 ] || { usage; exit 2; }; cases=$2; shift 2 ;;
    --params|--reps|--allgather)
      [ $# -ge 2 ] || { usage; exit 2; }; extra+=("$1" "$2"); shift 2 ;;
    --np) [ $# -ge 2 ] || { usage; exit 2; }; nps=$2; shift 2 ;;
    --quick) extra+=(--quick); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/zero.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
IFS=, read -r -a np_list <<<"$nps"
for np in "${np_list[@]}"; do
  case "$np" in
    ''|*[!0-9]*|0) echo "bench/zero.sh: bad process count '$np'" >&2; usage; exit 2 ;;
  esac
done

# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/zero.sh bench_zero

# The CPU cases in one run per process count; offload (GPU devices) in its own.
cpu_cases=$(tr ',' '\n' <<<"$cases" | grep -v '^offload$' | paste -sd, - || true)
offload=0
if tr ',' '\n' <<<"$cases" | grep -qx offload; then offload=1; fi
if [ -z "${DT_GPU:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then export DT_GPU=cuda; else export DT_GPU=sim; fi
fi

status=0
load "bench/run zero start"
for np in "${np_list[@]}"; do
  if [ -n "$cpu_cases" ]; then
    # shellcheck disable=SC2086
    DT_CPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$exe" ${extra[@]+"${extra[@]}"} \
      --cases "$cpu_cases" || status=1
  fi
  if [ "$offload" = 1 ]; then
    # shellcheck disable=SC2086
    DT_CPU_DEVICES=1 DT_GPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$exe" \
      ${extra[@]+"${extra[@]}"} --cases offload || status=1
  fi
done
load "bench/run zero end"
exit "$status"
