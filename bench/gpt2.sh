#!/usr/bin/env bash
# bench/run gpt2: examples/train_gpt2 from a random init on a random llm.c token shard, for
# GPT-2 124M (12 layers, width 768, 12 heads, vocabulary 50304) at B=4, T=64 as llm.c's CPU
# trainer runs it, and for a small model; on one process (1x1) and two (2x1, data parallel).
# Prints key=value lines: tokens_per_s (mean over the steps after the first), the achieved
# FLOP rate (6 x parameters x tokens/s + 12 x layers x T x width x tokens/s for attention),
# gemm_gflops (cblas_sgemm on the model's own matmul shapes, bench/gpt2_gemm.c, measured in
# the same run, one thread per process as the trainer's GEMMs get) and gemm_ratio = achieved /
# gemm rate. 2x1: tokens_per_s of the job and its ratio to 1x1 (scaling).
#   bench/gpt2.sh [--steps N] [--quick]   (--quick: the small model only)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=4
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "bench/gpt2.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/gpt2.sh bench_gpt2_gemm
ninja -C "$build" examples/train_gpt2 >&2
train="$build/examples/train_gpt2"
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
load "bench/run gpt2 start"
# case NAME LAYERS WIDTH HEADS VOCAB B T
bench_case() {
  local name=$1 L=$2 C=$3 H=$4 V=$5 B=$6 T=$7
  shard "$tmp/$name.bin" "$V"
  local gemm
  gemm=$(OPENBLAS_NUM_THREADS=1 "$exe" $((B * T)) "$C" "$V" | sed 's/gemm_gflops=//')
  local tps1=0 tps2=0 params=0
  for np in 1 2; do
    local mesh=1x1
    [ "$np" = 2 ] && mesh=2x1
    DT_CPU_DEVICES=1 OPENBLAS_NUM_THREADS=1 "$mpiexec" -n "$np" "$train" --init random \
      --layers "$L" --width "$C" --heads "$H" --vocab "$V" --seed 1 \
      --data "$tmp/$name.bin" --batch "$B" --context "$T" --steps "$steps" --lr 1e-4 \
      --mesh "$root/examples/meshes/$mesh.yaml" >"$tmp/$name-$np.log" 2>&1 ||
      { cat "$tmp/$name-$np.log" >&2; return 1; }
    local tps
    tps=$(awk '$1 == "step" && $2 > 0 { s += $6; k++ } END { printf "%.1f", k ? s / k : 0 }' \
      "$tmp/$name-$np.log")
    params=$(sed -n 's/.*params=\([0-9]*\).*/\1/p' "$tmp/$name-$np.log")
    if [ "$np" = 1 ]; then tps1=$tps; else tps2=$tps; fi
  done
  awk -v n="$name" -v p="$params" -v L="$L" -v C="$C" -v T="$T" -v t1="$tps1" -v t2="$tps2" \
      -v g="$gemm" -v B="$B" 'BEGIN {
    f = 6 * p + 12 * L * T * C
    a1 = f * t1 * 1e-9; a2 = f * t2 * 1e-9
    printf "case=gpt2_%s mesh=1x1 params=%d batch=%d context=%d tokens_per_s=%.1f achieved_gflops=%.3f gemm_gflops=%.3f gemm_ratio=%.3f\n", n, p, B, T, t1, a1, g, a1 / g
    printf "case=gpt2_%s mesh=2x1 processes=2 tokens_per_s=%.1f achieved_gflops=%.3f scaling=%.3f gemm_ratio_per_process=%.3f\n", n, t2, a2, t2 / t1, a2 / 2 / g
  }'
}
bench_case small 2 128 4 512 4 64
[ "$quick" = 1 ] || bench_case 124M 12 768 12 50304 4 64
load "bench/run gpt2 end"
