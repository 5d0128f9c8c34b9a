#!/usr/bin/env bash
# bench/run gpt2: examples/train_gpt2 from a random init on a random llm.c token shard, for
# GPT-2 124M (12 layers, width 768, 12 heads, vocabulary 50304) at B=4 and B=16, T=64, and for
# a small model (2 layers, width 128, vocabulary 512, B=4); on one process (1x1) and on two
# (2x1, data parallel), each as a plain run sets itself up: DT_CPU_DEVICES=1, OpenBLAS's thread
# count left to the library (cores / processes on the host: OPENBLAS_NUM_THREADS and
# OMP_NUM_THREADS are unset for the trainer), DT_BIND as the environment has it (the library's
# default when unset).
# Steady state only: a run makes WARMUP + STEPS steps and tokens/s is that of the last STEPS
# (their tokens over their summed time; the first steps allocate, fault pages in and run 3x
# slower). The references, measured in the same repetition as the runs they divide:
#   gemm_gflops  cblas_sgemm on the model's own matmul shapes (bench/gpt2_gemm.c: forward,
#                both backward products of each projection and of the tied head, rows B*T)
#                with the trainer's BLAS threads of one process (all the cores);
#   peak_gflops  cblas_sgemm on a 2048 x 2048 x 2048 product with the same threads.
# model_gflops = (6 x parameters + 12 x layers x T x width) x tokens/s; gemm_ratio =
# model_gflops / gemm_gflops, peak_ratio = model_gflops / peak_gflops; on 2x1 both against the
# same one-process references (the same cores), and dp_vs_single = 2x1 tokens/s / 1x1's.
# Cases are interleaved round by round (REPS rounds); each figure is the median over rounds,
# each round's load average printed as a comment. --baseline DIR also runs DIR's
# examples/train_gpt2 (an older build: `git worktree add` the old commit, build it there) in
# every round right after this build's, and prints vs_baseline = ours / its tokens/s.
#   bench/gpt2.sh [--steps N] [--warmup W] [--reps R] [--batches 4,16] [--only-1x1]
#                 [--baseline BUILD_DIR] [--quick]   (--quick: the small model, 1 round)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=6
warmup=2
reps=3
batches=4,16
quick=0
only1=0
baseline=""
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --only-1x1) only1=1; shift ;;
    --baseline) baseline=$(cd "$2" && pwd); shift 2 ;;
    --quick) quick=1; reps=1; steps=3; warmup=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/gpt2.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
for v in "$steps" "$reps"; do
  case "$v" in ''|*[!0-9]*|0) echo "bench/gpt2.sh: bad count '$v'" >&2; exit 2 ;; esac
done
case "$warmup" in ''|*[!0-9]*) echo "bench/gpt2.sh: bad --warmup '$warmup'" >&2; exit 2 ;; esac
if [ -n "$baseline" ] && [ ! -x "$baseline/examples/train_gpt2" ]; then
  echo "bench/gpt2.sh: no $baseline/examples/train_gpt2" >&2
  exit 2
fi
user_bind=${DT_BIND-}
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/gpt2.sh bench_gpt2_gemm
[ "${DT_BENCH_NO_BUILD:-0}" = 1 ] || ninja -C "$build" examples/train_gpt2 >&2
# prepare.sh defaults DT_BIND to 0 for its benchmarks; this one runs as a plain run does.
if [ -z "$user_bind" ]; then unset DT_BIND; fi
train="$build/examples/train_gpt2"
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A token shard of 200000 tokens below the vocabulary (llm.c's format; plain python3).
shard() {
  python3 - "$1" "$2" <<'PY'
import random, struct, sys
n, v = 200000, int(sys.argv[2])
r = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(r.randrange(v) for _ in range(n))))
PY
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# train PROGRAM NP LOG MODEL_ARGS... -> tokens/s of the steps after the warm-up, and writes
# the parameter count to LOG.params
train() {
  local prog=$1 np=$2 log=$3 mesh=1x1
  shift 3
  [ "$np" = 2 ] && mesh=2x1
  # shellcheck disable=SC2086  # MPIRUN_ARGS: several words
  env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS DT_CPU_DEVICES=1 \
    "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$prog" --init random --seed 1 --lr 1e-4 \
    --steps $((warmup + steps)) --mesh "$root/examples/meshes/$mesh.yaml" "$@" \
    >"$log" 2>&1 || { cat "$log" >&2; return 1; }
  sed -n 's/.*params=\([0-9]*\).*/\1/p' "$log" >"$log.params"
  awk -v w="$warmup" '$1 == "step" && $2 >= w && $6 > 0 { s += 1 / $6; k++ }
    END { if (k) printf "%.3f\n", k / s; else exit 1 }' "$log"
}

# case NAME LAYERS WIDTH HEADS VOCAB B T
names=()
declare -A args flops gemm peak tps
add_case() {
  local name=$1 L=$2 C=$3 H=$4 V=$5 B=$6 T=$7
  [ -f "$tmp/v$V.bin" ] || shard "$tmp/v$V.bin" "$V"
  names+=("$name")
  args[$name]="--layers $L --width $C --heads $H --vocab $V --batch $B --context $T --data $tmp/v$V.bin"
  flops[$name]="$L $C $T $V $B"
}
add_case small_b4 2 128 4 512 4 64
if [ "$quick" = 0 ]; then
  IFS=',' read -ra bl <<<"$batches"
  for b in "${bl[@]}"; do add_case "124M_b$b" 12 768 12 50304 "$b" 64; done
fi
nps=(1 2)
[ "$only1" = 1 ] && nps=(1)
progs=(ours)
[ -n "$baseline" ] && progs+=(baseline)

load "bench/run gpt2 start"
echo "# bench/run gpt2: $cores cores, warm-up $warmup steps, $steps timed steps, $reps rounds," \
  "DT_BIND=${DT_BIND-(unset: library default)}, $("$exe" --core)"
status=0
for ((r = 1; r <= reps; r++)); do
  load "round $r"
  pk=$(OPENBLAS_NUM_THREADS=$cores "$exe" --square 2048 2 | sed 's/peak_gflops=//')
  peak[all]="${peak[all]:-} $pk"
  for name in "${names[@]}"; do
    read -r L C T V B <<<"${flops[$name]}"
    g=$(OPENBLAS_NUM_THREADS=$cores "$exe" $((B * T)) "$C" "$V" 2 | sed 's/gemm_gflops=//')
    gemm[$name]="${gemm[$name]:-} $g"
    for np in "${nps[@]}"; do
      for prog in "${progs[@]}"; do
        p=$train
        [ "$prog" = baseline ] && p="$baseline/examples/train_gpt2"
        # shellcheck disable=SC2086
        t=$(train "$p" "$np" "$tmp/$name-$np-$prog.log" ${args[$name]}) || { status=1; t=""; }
        tps[$name|$np|$prog]="${tps[$name|$np|$prog]:-} $t"
      done
    done
  done
done
load "bench/run gpt2 end"
pk=$(echo "${peak[all]}" | median)
for name in "${names[@]}"; do
  read -r L C T V B <<<"${flops[$name]}"
  g=$(echo "${gemm[$name]}" | median)
  params=$(cat "$tmp/$name-1-ours.log.params" 2>/dev/null || echo 0)
  for prog in "${progs[@]}"; do
    t1=$(echo "${tps[$name|1|ours]}" | median)
    for np in "${nps[@]}"; do
      t=$(echo "${tps[$name|$np|$prog]}" | median)
      [ -n "$t" ] || { echo "case=gpt2_$name processes=$np build=$prog failed=1"; continue; }
      tb=""
      [ "$prog" = ours ] && [ -n "$baseline" ] && tb=$(echo "${tps[$name|$np|baseline]}" | median)
      awk -v n="$name" -v np="$np" -v prog="$prog" -v p="$params" -v L="$L" -v C="$C" \
          -v T="$T" -v B="$B" -v t="$t" -v t1="$t1" -v tb="$tb" -v g="$g" -v pk="$pk" \
          -v cores="$cores" -v all="${tps[$name|$np|$prog]}" 'BEGIN {
        f = (6 * p + 12 * L * T * C) * t * 1e-9
        printf "case=gpt2_%s mesh=%dx1 processes=%d blas_threads=%d build=%s batch=%d context=%d params=%d tokens_per_s=%.1f model_gflops=%.2f gemm_gflops=%.2f gemm_ratio=%.3f peak_gflops=%.2f peak_ratio=%.3f",
          n, np, np, cores / np, prog, B, T, p, t, f, g, f / g, pk, f / pk
        if (np == 2 && prog == "ours" && t1 > 0) printf " dp_vs_single=%.3f", t / t1
        if (tb != "" && tb > 0) printf " vs_baseline=%.3f", t / tb
        printf " # tokens/s by round:%s\n", all }'
    done
  done
done
exit "$status"
