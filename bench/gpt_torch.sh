#!/usr/bin/env bash
# bench/run gpt --vs-torch: examples/train_gpt against the same model in PyTorch
# (bench/gpt_torch.py), interleaved in the same run: train_gpt's default size (width 64,
# 2 layers) and width 256 / 4 layers, on 1 process (mesh 1x1; PyTorch plain) and 2 processes
# (mesh 2x1, data parallel; PyTorch DDP over gloo), each with the machine's OpenBLAS settings
# and again with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that command alone. Each
# case runs REPS times, ours then PyTorch's, round after round; the median of each side is
# printed with vs_torch = ours / PyTorch (tokens per second of the training steps).
#   bench/gpt_torch.sh [--steps N] [--reps R] [--quick]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/run gpt --vs-torch [--steps N] [--reps R] [--quick]
  --steps N   training steps per run at the default size (default 60; width 256: N/3)
  --reps R    interleaved runs per side and case (default 3; --quick: 1 run of 20 steps)
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS, PYTHON
(default /usr/bin/python3, which has torch).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=60
reps=3
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || { usage; exit 2; }; steps=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || { usage; exit 2; }; reps=$2; shift 2 ;;
    --quick) steps=20; reps=1; shift ;;
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
ninja -C "$build" examples/train_gpt >&2
train="$build/examples/train_gpt"
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

# torch SIZE_ARGS PROCS BLAS STEPS -> tokens/s of the timed steps
torch_run() {
  local model=$1 np=$2 blas=$3 n=$4
  # shellcheck disable=SC2086
  $(blas_env "$blas") "$python" "$root/bench/gpt_torch.py" --procs "$np" --steps "$n" \
    --cores "$(nproc)" $model 2>"$tmp/torch.err" | sed -n 's/^torch_tokens_per_s=//p' ||
    { cat "$tmp/torch.err" >&2; return 1; }
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

load "bench/run gpt --vs-torch start"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-(unset)}"
sizes=("default:" "w256:--width 256 --layers 4")
declare -A got_ours got_torch
cases=()
for s in "${sizes[@]}"; do
  for np in 1 2; do
    for blas in machine unset; do
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
    a=$(ours "$model" "$np" "$blas" "$n") || a=""
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
