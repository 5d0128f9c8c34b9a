#!/usr/bin/env bash
# Runs examples/train_gpt as a benchmark (docs/bench.md): the default model on one device
# (1x1 mesh, one process) and on the 2x2 mesh (4 processes of one CPU device), each for N and
# 2N steps; the difference of the two runs is the cost of N steps alone (start-up, the final
# evaluation, sampling and the checkpoint cancel out). Reports tokens/s per process on 2x2
# against one device (the scaling efficiency) and the share of the step time spent inside MPI
# (an LD_PRELOAD shim of the MPI profiling interface, bench/mpi_time.c, averaged over ranks).
# Results on stdout as key=value lines; build output and launcher messages on stderr.
#   bench/gpt.sh [--steps N] [--quick] [-- TRAIN_GPT_OPTIONS...]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/gpt.sh [--steps N] [--quick] [-- train_gpt options]
  --steps N   timed steps per mesh: runs of N and 2N steps (default 60; --quick: 20)
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS (extra launcher args).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "${1:-}" = --vs-torch ] && { shift; exec "$root/bench/gpt_torch.sh" "$@"; } # against PyTorch
steps=60
model=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || { usage; exit 2; }; steps=$2; shift 2 ;;
    --quick) steps=20; shift ;;
    --) shift; model=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/gpt.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
case "$steps" in ''|*[!0-9]*|0) echo "bench/gpt.sh: bad --steps '$steps'" >&2; exit 2 ;; esac

# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/gpt.sh libdt_bench_mpi_time.so
ninja -C "$build" examples/train_gpt >&2
shim=$(cd "$build/bench" && pwd)/libdt_bench_mpi_time.so
train="$build/examples/train_gpt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run MESH PROCS STEPS -> "train_seconds comm_seconds" (comm averaged over ranks)
run() {
  local mesh=$1 np=$2 n=$3 out="$tmp/$1-$3"
  # shellcheck disable=SC2086
  DT_CPU_DEVICES=1 DT_BENCH_COMM_FILE="$out.comm" \
    "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} env LD_PRELOAD="$shim" "$train" \
    --mesh "$root/examples/meshes/$mesh.yaml" --steps "$n" --eval-every 1000000 \
    --samples 0 --out "$out" ${model[@]+"${model[@]}"} >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; return 1; }
  local tps
  tps=$(sed -n 's/.* \([0-9.]*\) tokens\/s in training steps.*/\1/p' "$out.log")
  awk -v tps="$tps" -v n="$n" -v logf="$out.log" 'BEGIN {
        while ((getline line < logf) > 0)
          if (match(line, /, [0-9]+ names per batch/)) {
            b = substr(line, RSTART + 2, RLENGTH - 2); sub(/ .*/, "", b) }
        printf "%.6f ", n * b * 16 / tps }'
  cat "$out.comm".* | sed 's/comm_seconds=\([0-9.]*\).*/\1/' |
    awk '{ s += $1; k++ } END { printf "%.6f\n", s / k }'
}

load "bench/run gpt start"
status=0
declare -A per_step comm
for spec in 1x1:1 2x2:4; do
  mesh=${spec%%:*}
  np=${spec##*:}
  read -r t1 c1 < <(run "$mesh" "$np" "$steps") || { status=1; continue; }
  read -r t2 c2 < <(run "$mesh" "$np" $((2 * steps))) || { status=1; continue; }
  per_step[$mesh]=$(awk -v a="$t1" -v b="$t2" -v n="$steps" 'BEGIN { printf "%.6f", (b - a) / n }')
  comm[$mesh]=$(awk -v a="$c1" -v b="$c2" -v n="$steps" 'BEGIN { printf "%.6f", (b - a) / n }')
done
batch=64
for ((i = 0; i < ${#model[@]}; i++)); do
  [ "${model[$i]}" = --batch ] && batch=${model[$((i + 1))]}
done
if [ -n "${per_step[1x1]:-}" ] && [ -n "${per_step[2x2]:-}" ]; then
  awk -v s1="${per_step[1x1]}" -v s4="${per_step[2x2]}" -v c4="${comm[2x2]}" -v b="$batch" \
      -v n="$steps" 'BEGIN {
    tok = b * 16
    printf "case=gpt mesh=1x1 procs=1 steps=%d step_ms=%.2f tokens_per_s=%.0f tokens_per_s_per_process=%.0f\n",
      n, 1000 * s1, tok / s1, tok / s1
    printf "case=gpt mesh=2x2 procs=4 steps=%d step_ms=%.2f tokens_per_s=%.0f tokens_per_s_per_process=%.0f scaling_efficiency=%.3f comm_ms_per_step=%.2f comm_share=%.3f\n",
      n, 1000 * s4, tok / s4, tok / s4 / 4, (tok / s4 / 4) / (tok / s1), 1000 * c4, c4 / s4 }'
fi
load "bench/run gpt end"
exit "$status"
