#!/usr/bin/env bash
# Runs examples/train_gpt as a benchmark (docs/bench.md): the default model on one device
# (1x1 mesh, one process) and on the 2x2 mesh (4 processes of one CPU device), each for N and
# 2N steps; the difference of the two runs is the cost of N steps alone (start-up, the final
# evaluation, sampling and the checkpoint cancel out). Reports tokens/s per process on 2x2
# against one device (the scaling efficiency) and the share of the step time spent inside MPI
# (an LD_PRELOAD shim of the MPI profiling interface, bench/mpi_time.c, averaged over ranks).
# Then the autograd tape against the hand-written backward on one device (1x1), for the default
# model and for width 256, 4 layers, 8 heads, context 64 (names packed), each case run for N
# and 2N steps so that the difference is the cost of N steps alone: tokens/s with the tape
# against the test-only BUILD/tests/train_gpt_manual --manual-backward (train_gpt's code with
# the hand-written backward pass of tests/examples/gpt_manual_backward.c) in the same run
# (tape_vs_manual), the most bytes the tape held for the backward pass with --checkpoint-blocks
# against without (act_mem_ratio; act_mem_bound = 2/L, i.e. 1/L of the full amount plus one
# block's worth when the blocks hold the activations) and the step time with recomputation
# against without (recompute_step_ratio), and the most tensor memory in use during a step with
# the tape against the hand-written backward (peak_vs_manual; train_gpt's `memory:` line, the
# host pool's peak_bytes_requested).
# Results on stdout as key=value lines; build output and launcher messages on stderr.
#   bench/gpt.sh [--steps N] [--tape-steps N] [--tape-reps N] [--tape-only] [--quick]
#                [-- TRAIN_GPT_OPTIONS...]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/gpt.sh [--steps N] [--quick] [-- train_gpt options]
  --steps N   timed steps per mesh: runs of N and 2N steps (default 60; --quick: 20)
  --tape-steps N  timed steps of each tape/manual/recompute case at width 256: runs of N and
                  2N steps (default 20; --quick: 5); the default model runs 25N and 50N
  --tape-reps N   interleaved repeats of the three cases, times summed (default 2)
  --tape-only     only the tape measurements
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS (extra launcher args).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "${1:-}" = --vs-torch ] && { shift; exec "$root/bench/gpt_torch.sh" "$@"; } # against PyTorch
steps=60
tape_steps=20
tape_reps=2
tape_only=0
model=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || { usage; exit 2; }; steps=$2; shift 2 ;;
    --quick) steps=20; tape_steps=5; shift ;;
    --tape-steps) [ $# -ge 2 ] || { usage; exit 2; }; tape_steps=$2; shift 2 ;;
    --tape-reps) [ $# -ge 2 ] || { usage; exit 2; }; tape_reps=$2; shift 2 ;;
    --tape-only) tape_only=1; shift ;;
    --) shift; model=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/gpt.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
case "$steps" in ''|*[!0-9]*|0) echo "bench/gpt.sh: bad --steps '$steps'" >&2; exit 2 ;; esac
case "$tape_reps" in ''|*[!0-9]*|0) echo "bench/gpt.sh: bad --tape-reps '$tape_reps'" >&2; exit 2 ;; esac

# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/gpt.sh libdt_bench_mpi_time.so
[ "${DT_BENCH_NO_BUILD:-0}" = 1 ] || ninja -C "$build" examples/train_gpt tests/train_gpt_manual >&2
shim=$(cd "$build/bench" && pwd)/libdt_bench_mpi_time.so
train="$build/examples/train_gpt"
manual="$build/tests/train_gpt_manual" # train_gpt plus --manual-backward (tests/meson.build)
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
specs="1x1:1 2x2:4"
[ "$tape_only" = 1 ] && specs=""
for spec in $specs; do
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
# tape_run NAME STEPS PROGRAM ARGS... -> "train_seconds tokens_per_step held_bytes peak_bytes
# cpu_seconds" of one 1x1 run (train_seconds: the steps' own time, from the tokens/s train_gpt
# prints; peak_bytes: the most tensor memory in use during a step; cpu_seconds: the process's
# CPU time in the steps, which other load on the machine inflates less than wall time)
tape_run() {
  local out="$tmp/tape-$1" n=$2 prog=$3
  shift 3
  DT_CPU_DEVICES=1 "$prog" --mesh "$root/examples/meshes/1x1.yaml" --steps "$n" \
    --eval-every 1000000 --samples 0 --out "$out" "$@" >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; return 1; }
  awk -v n="$n" '
    /names per batch/ { b = $0; sub(/ names per batch.*/, "", b); sub(/.* /, "", b) }
    /^  model:/ { t = $0; sub(/.*context /, "", t); sub(/[^0-9].*/, "", t) }
    /tokens\/s in training steps/ { tps = $0; sub(/ tokens\/s in training steps.*/, "", tps)
                                    sub(/.* /, "", tps) }
    /tape: at most/ { h = $0; sub(/.*at most /, "", h); sub(/ .*/, "", h) }
    /memory: at most/ { m = $0; sub(/.*at most /, "", m); sub(/ .*/, "", m) }
    /^  cpu: / { c = $2 }
    END { if (tps <= 0 || b * t <= 0 || h == "" || m == "" || c == "") exit 1
          printf "%.6f %d %s %s %s\n", n * b * t / tps, b * t, h, m, c }' "$out.log" ||
    { echo "bench/gpt.sh: cannot read $out.log" >&2; return 1; }
}

# The default model's steps are about 60x shorter than width 256's: it runs 25N and 50N steps
# (at 5N and 10N its ratios moved by 0.3 between runs: 100 extra steps are about 1 s).
for cfg in "default:25:" "w256_l4_h8_t64:1:--width 256 --layers 4 --heads 8 --context 64"; do
  name=${cfg%%:*}
  spec=${cfg#*:}
  n=$((tape_steps * ${spec%%:*}))
  cfg=$spec
  # shellcheck disable=SC2206
  args=(${cfg#*:})
  layers=2
  for ((i = 0; i < ${#args[@]}; i++)); do
    [ "${args[$i]}" = --layers ] && layers=${args[$((i + 1))]}
  done
  # The three cases interleaved tape_reps times, each as a run of N then one of 2N steps; the
  # per-step time of each case from the sums over the repeats.
  declare -A best=() held=() peak=() sum1=() sum2=() cpu=() csum1=() csum2=()
  tok=0
  for ((rep = 1; rep <= tape_reps; rep++)); do
    for mode in tape manual ckpt; do
      extra=()
      prog=$train
      [ "$mode" = manual ] && { prog=$manual; extra=(--manual-backward); }
      [ "$mode" = ckpt ] && extra=(--checkpoint-blocks)
      read -r t1 tok b m c1 < <(tape_run "$name-$mode-$rep-1" "$n" "$prog" \
        ${args[@]+"${args[@]}"} "${extra[@]}") || { status=1; continue; }
      read -r t2 tok b m c2 < <(tape_run "$name-$mode-$rep-2" $((2 * n)) "$prog" \
        ${args[@]+"${args[@]}"} "${extra[@]}") || { status=1; continue; }
      held[$mode]=$b
      peak[$mode]=$m
      # Summed over the repeats: the mean per-step time (a best-of-repeats of differences
      # would pick the luckiest pair and bias the ratios).
      sum1[$mode]=$(awk -v a="${sum1[$mode]:-0}" -v t="$t1" 'BEGIN { printf "%.6f", a + t }')
      sum2[$mode]=$(awk -v a="${sum2[$mode]:-0}" -v t="$t2" 'BEGIN { printf "%.6f", a + t }')
      best[$mode]=$(awk -v a="${sum1[$mode]}" -v b="${sum2[$mode]}" -v n="$n" -v r="$rep" \
        'BEGIN { s = (b - a) / (n * r); if (s <= 0) s = b / (2 * n * r); print s }')
      csum1[$mode]=$(awk -v a="${csum1[$mode]:-0}" -v t="$c1" 'BEGIN { printf "%.6f", a + t }')
      csum2[$mode]=$(awk -v a="${csum2[$mode]:-0}" -v t="$c2" 'BEGIN { printf "%.6f", a + t }')
      cpu[$mode]=$(awk -v a="${csum1[$mode]}" -v b="${csum2[$mode]}" -v n="$n" -v r="$rep" \
        'BEGIN { s = (b - a) / (n * r); if (s <= 0) s = b / (2 * n * r); print s }')
    done
  done
  if [ -n "${best[tape]:-}" ] && [ -n "${best[manual]:-}" ] && [ -n "${best[ckpt]:-}" ]; then
    awk -v n="$name" -v L="$layers" -v s="$n" -v tok="$tok" -v st="${best[tape]}" \
        -v sm="${best[manual]}" -v sc="${best[ckpt]}" -v bt="${held[tape]}" -v bc="${held[ckpt]}" \
        -v pt="${peak[tape]}" -v pm="${peak[manual]}" -v pc="${peak[ckpt]}" \
        -v ct="${cpu[tape]}" -v cm="${cpu[manual]}" -v cc="${cpu[ckpt]}" 'BEGIN {
      printf "case=gpt_tape model=%s mesh=1x1 steps=%d tape_tokens_per_s=%.0f manual_tokens_per_s=%.0f recompute_tokens_per_s=%.0f tape_vs_manual=%.3f tape_vs_manual_cpu=%.3f held_bytes=%d held_bytes_recompute=%d act_mem_ratio=%.3f act_mem_bound=%.3f recompute_step_ratio=%.3f recompute_step_ratio_cpu=%.3f peak_bytes_tape=%d peak_bytes_manual=%d peak_bytes_recompute=%d peak_vs_manual=%.3f\n",
        n, s, tok / st, tok / sm, tok / sc, sm / st, cm / ct, bt, bc, bc / bt, 2 / L, sc / st, cc / ct, pt, pm, pc, pt / pm }'
  fi
done
load "bench/run gpt end"
exit "$status"
