#!/usr/bin/env bash
# bench/run gpt --vs-torch: examples/train_gpt against the same model in PyTorch
# (bench/gpt_torch.py), interleaved in the same run: train_gpt's default size (width 64,
# 2 layers) and width 256 / 4 layers, on 1 process (mesh 1x1; PyTorch plain) and 2 processes
# (mesh 2x1, data parallel; PyTorch DDP over gloo), each with the machine's OpenBLAS settings
# and again with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that command alone. Each
# case runs REPS times, ours then PyTorch's, round after round; the median of each side is
# printed with vs_torch = ours / PyTorch (tokens per second of the training steps).
# --gpt2 adds examples/train_gpt2's GPT-2 (bench/gpt_torch.py --arch gpt2): a small one (2
# layers, width 128, vocabulary 512) and 124M (12 layers, width 768, 12 heads, vocabulary
# 50304), B=4, T=64 as llm.c's CPU trainer runs it; tokens/s of the steps after the first.
# Where the machine sets neither OPENBLAS variable, the `unset` cases would repeat the
# `machine` ones command for command: they are left out and a comment line says so.
#   bench/gpt_torch.sh [--steps N] [--reps R] [--quick] [--gpt2]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/run gpt --vs-torch [--steps N] [--reps R] [--quick] [--gpt2]
  --steps N   training steps per run at the default size (default 60; width 256: N/3;
              GPT-2: 6 for the small one, 4 for 124M)
  --reps R    interleaved runs per side and case (default 3; --quick: 1 run of 20 steps)
  --gpt2      also GPT-2 small and 124M (train_gpt2 against GPT-2 in PyTorch), B=4 T=64
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS, PYTHON
(default /usr/bin/python3, which has torch).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=60
reps=3
gpt2=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || { usage; exit 2; }; steps=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || { usage; exit 2; }; reps=$2; shift 2 ;;
    --quick) steps=20; reps=1; shift ;;
    --gpt2) gpt2=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/gpt_torch.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
for v in "$steps" "$reps"; do
  case "$v" in ''|*[!0-9]*|0) echo "bench/gpt_torch.sh: bad count '$v'" >&2; exit 2 ;; esac
done

# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/gpt_torch.sh libdt_bench_mpi_time.so
ninja -C "$build" examples/train_gpt examples/train_gpt2 >&2
train="$build/examples/train_gpt"
train2="$build/examples/train_gpt2"
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import torch' 2>/dev/null ||
  { echo "bench/gpt_torch.sh: $python has no torch" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Environment prefix of a case: the machine's OpenBLAS settings, or these two unset.
blas_env() { [ "$1" = unset ] && echo "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE" || echo env; }

# ours SIZE_ARGS PROCS BLAS STEPS -> tokens/s of train_gpt's training steps
ours() {
  local model=$1 np=$2 blas=$3 n=$4 mesh=1x1 out="$tmp/ours"
  [ "$np" = 2 ] && mesh=2x1
  # shellcheck disable=SC2086
  $(blas_env "$blas") DT_CPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$train" \
    --mesh "$root/examples/meshes/$mesh.yaml" --steps "$n" --eval-every 1000000 \
    --samples 0 --out "$out" $model >"$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
  sed -n 's/.* \([0-9.]*\) tokens\/s in training steps.*/\1/p' "$out.log" | tail -1
}

# ours_gpt2 SIZE_ARGS PROCS BLAS STEPS -> mean tokens/s of train_gpt2's steps after the first
ours_gpt2() {
  local model=$1 np=$2 blas=$3 n=$4 mesh=1x1 log="$tmp/ours2.log"
  [ "$np" = 2 ] && mesh=2x1
  [ -f "$tmp/tokens.bin" ] || python3 - "$tmp/tokens.bin" <<'PY'
import random, struct, sys
n, v = 100000, 512
r = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(r.randrange(v) for _ in range(n))))
PY
  # shellcheck disable=SC2086
  $(blas_env "$blas") DT_CPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$train2" \
    --init random --seed 1 --data "$tmp/tokens.bin" --batch 4 --context 64 --steps "$n" \
    --lr 1e-4 --mesh "$root/examples/meshes/$mesh.yaml" $model >"$log" 2>&1 ||
    { cat "$log" >&2; return 1; }
  awk '$1 == "step" && $2 > 0 { s += $6; k++ } END { if (k) printf "%.1f\n", s / k }' "$log"
}

# torch SIZE_ARGS PROCS BLAS STEPS -> tokens/s of the timed steps
torch_run() {
  local model=$1 np=$2 blas=$3 n=$4
  # shellcheck disable=SC2086
  local extra=""
  case "$model" in *--arch\ gpt2*) extra="--batch 4 --context 64 --warmup 1" ;; esac
  $(blas_env "$blas") "$python" "$root/bench/gpt_torch.py" --procs "$np" --steps "$n" \
    --cores "$(nproc)" $extra $model 2>"$tmp/torch.err" | sed -n 's/^torch_tokens_per_s=//p' ||
    { cat "$tmp/torch.err" >&2; return 1; }
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

load "bench/run gpt --vs-torch start"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-(unset)}"
sizes=("default:" "w256:--width 256 --layers 4")
# GPT-2 sizes: ours gets SIZE_ARGS without --arch (train_gpt2's flags), PyTorch with it.
[ "$gpt2" = 1 ] && sizes+=(
  "gpt2_small:--arch gpt2 --layers 2 --width 128 --heads 4 --vocab 512"
  "gpt2_124M:--arch gpt2 --layers 12 --width 768 --heads 12 --vocab 50304")
blas_cases=(machine unset)
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -z "${OPENBLAS_L2_SIZE:-}" ]; then
  blas_cases=(machine)
  echo "# neither OPENBLAS variable is set here: the openblas=unset cases would repeat openblas=machine, left out"
fi
declare -A got_ours got_torch
cases=()
for s in "${sizes[@]}"; do
  for np in 1 2; do
    for blas in "${blas_cases[@]}"; do
      cases+=("${s%%:*}|$np|$blas")
    done
  done
done
for ((r = 0; r < reps; r++)); do
  for c in "${cases[@]}"; do
    IFS='|' read -r size np blas <<<"$c"
    model=""
    for s in "${sizes[@]}"; do [ "${s%%:*}" = "$size" ] && model=${s#*:}; done
    n=$steps
    [ "$size" = w256 ] && n=$(( steps / 3 > 5 ? steps / 3 : 5 ))
    case "$size" in
      gpt2_small) n=6 ;;
      gpt2_124M) n=4 ;;
    esac
    if [ "${size#gpt2}" != "$size" ]; then
      a=$(ours_gpt2 "${model#--arch gpt2 }" "$np" "$blas" "$n") || a=""
      # PyTorch: one warm-up step, then the same steps as ours times (all but the first).
      n=$((n - 1))
    else
      a=$(ours "$model" "$np" "$blas" "$n") || a=""
    fi
    b=$(torch_run "$model" "$np" "$blas" "$n") || b=""
    got_ours[$c]="${got_ours[$c]:-} $a"
    got_torch[$c]="${got_torch[$c]:-} $b"
  done
done
status=0
for c in "${cases[@]}"; do
  IFS='|' read -r size np blas <<<"$c"
  a=$(echo "${got_ours[$c]}" | median)
  b=$(echo "${got_torch[$c]}" | median)
  if [ -z "$a" ] || [ -z "$b" ]; then
    echo "case=gpt_vs_torch size=$size procs=$np openblas=$blas failed=1"
    status=1
    continue
  fi
  awk -v s="$size" -v np="$np" -v bl="$blas" -v a="$a" -v b="$b" -v r="$reps" \
    -v ra="${got_ours[$c]}" -v rb="${got_torch[$c]}" 'BEGIN {
      printf "case=gpt_vs_torch size=%s procs=%s openblas=%s runs=%d ours_tokens_per_s=%.0f torch_tokens_per_s=%.0f vs_torch=%.3f # ours:%s torch:%s\n",
        s, np, bl, r, a, b, a / b, ra, rb }'
done
load "bench/run gpt --vs-torch end"
exit "$status"
