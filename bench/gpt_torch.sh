#!/usr/bin/env bash
# bench/run gpt --vs-torch: examples/train_gpt against the same model in PyTorch
# (bench/gpt_torch.py), interleaved in the same run, each side in every configuration a user
# would try on this host, and the best of each side compared:
#   ours     1 process as a plain run sets itself up (OpenBLAS threads left to the library:
#            cores / processes), 1 process with OPENBLAS_NUM_THREADS=1, 2 processes (mesh
#            2x1, data parallel, the library's one BLAS thread each); DT_BIND as the
#            environment has it (the library's default when unset);
#   PyTorch  1 process at 1 and at `cores` intra-op threads, 2 processes (DDP over gloo) at
#            one thread each, each with OPENBLAS_NUM_THREADS=1 and with it unset.
# Both sides time the same steps after the same warm-up: PyTorch its --warmup steps, then the
# timed ones; ours --eval-every W (W = the warm-up) and the windows after the first (train_gpt
# prints each window's tokens/s of its training steps; the evaluation is outside them), or for
# GPT-2 train_gpt2's per-step lines after the first W. Sizes: train_gpt's default (width 64,
# 2 layers) and width 256 / 4 layers; --gpt2 adds examples/train_gpt2's GPT-2 (bench/gpt_torch.py
# --arch gpt2): a small one (2 layers, width 128, vocabulary 512) and 124M (12 layers, width
# 768, 12 heads, vocabulary 50304), B=4, T=64 as llm.c's CPU trainer runs it.
# Each configuration runs REPS times, round after round (every configuration once per round);
# a configuration's figure is its median. Prints a line per configuration (tokens/s, its runs)
# and per size: vs_torch = our best / PyTorch's best, each best's configuration named,
# dp_vs_single (ours, 2 processes against the best 1-process) and default_vs_best (ours, the
# plain run against our best).
#   bench/gpt_torch.sh [--steps N] [--reps R] [--quick] [--gpt2]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/run gpt --vs-torch [--steps N] [--reps R] [--quick] [--gpt2]
  --steps N   timed steps per run at the default size (default 60; width 256: N/3; GPT-2
              small 6, 124M 4), after a warm-up of 5 steps (GPT-2: 2)
  --reps R    interleaved runs per configuration (default 3; --quick: 1 run of 20 steps)
  --gpt2      also GPT-2 small and 124M (train_gpt2 against GPT-2 in PyTorch), B=4 T=64
Environment: BUILD_DIR (default build), DT_BIND (default: the library's), MPIRUN_ARGS,
PYTHON (default /usr/bin/python3, which has torch).
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

user_bind=${DT_BIND-}
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/gpt_torch.sh libdt_bench_mpi_time.so
# prepare.sh defaults DT_BIND to 0 for its benchmarks; ours runs as a plain run does here.
if [ -z "$user_bind" ]; then unset DT_BIND; fi
ninja -C "$build" examples/train_gpt examples/train_gpt2 >&2
train="$build/examples/train_gpt"
train2="$build/examples/train_gpt2"
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import torch' 2>/dev/null ||
  { echo "bench/gpt_torch.sh: $python has no torch" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cores=$(nproc)

# ours SIZE_ARGS PROCS BLAS STEPS WARMUP -> tokens/s of train_gpt's windows after the first
# (BLAS: lib = OpenBLAS threads left to the library, 1 = OPENBLAS_NUM_THREADS=1)
ours() {
  local model=$1 np=$2 blas=$3 n=$4 w=$5 mesh=1x1 out="$tmp/ours"
  [ "$np" = 2 ] && mesh=2x1
  local benv=(env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS)
  [ "$blas" = 1 ] && benv=(env OPENBLAS_NUM_THREADS=1)
  # Whole windows: the timed steps rounded up to a multiple of the warm-up.
  n=$(( (n + w - 1) / w * w ))
  # shellcheck disable=SC2086
  "${benv[@]}" DT_CPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$train" \
    --mesh "$root/examples/meshes/$mesh.yaml" --steps $((w + n)) --eval-every "$w" \
    --samples 0 --out "$out" $model >"$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
  awk '/^step .* tokens\/s/ { k++; if (k > 1) { s += 1 / $(NF - 1); m++ } }
       END { if (m) printf "%.1f\n", m / s }' "$out.log"
}

# ours_gpt2 SIZE_ARGS PROCS BLAS STEPS WARMUP -> tokens/s of train_gpt2's steps after the
# first WARMUP
ours_gpt2() {
  local model=$1 np=$2 blas=$3 n=$4 w=$5 mesh=1x1 log="$tmp/ours2.log"
  [ "$np" = 2 ] && mesh=2x1
  local benv=(env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS)
  [ "$blas" = 1 ] && benv=(env OPENBLAS_NUM_THREADS=1)
  [ -f "$tmp/tokens.bin" ] || python3 - "$tmp/tokens.bin" <<'PY'
import random, struct, sys
n, v = 100000, 512
r = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(r.randrange(v) for _ in range(n))))
PY
  # shellcheck disable=SC2086
  "${benv[@]}" DT_CPU_DEVICES=1 "$mpiexec" -n "$np" ${MPIRUN_ARGS:-} "$train2" \
    --init random --seed 1 --data "$tmp/tokens.bin" --batch 4 --context 64 \
    --steps $((w + n)) --lr 1e-4 --mesh "$root/examples/meshes/$mesh.yaml" $model >"$log" 2>&1 ||
    { cat "$log" >&2; return 1; }
  awk -v w="$w" '$1 == "step" && $2 >= w && $6 > 0 { s += 1 / $6; k++ }
    END { if (k) printf "%.1f\n", k / s }' "$log"
}

# torch SIZE_ARGS PROCS THREADS BLAS STEPS WARMUP -> tokens/s of the timed steps
torch_run() {
  local model=$1 np=$2 th=$3 blas=$4 n=$5 w=$6
  local benv=(env -u OPENBLAS_NUM_THREADS)
  [ "$blas" = 1 ] && benv=(env OPENBLAS_NUM_THREADS=1)
  local extra=""
  case "$model" in *--arch\ gpt2*) extra="--batch 4 --context 64" ;; esac
  # shellcheck disable=SC2086
  "${benv[@]}" "$python" "$root/bench/gpt_torch.py" --procs "$np" --threads "$th" \
    --steps "$n" --warmup "$w" --cores "$cores" $extra $model 2>"$tmp/torch.err" |
    sed -n 's/^torch_tokens_per_s=//p' || { cat "$tmp/torch.err" >&2; return 1; }
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

load "bench/run gpt --vs-torch start"
echo "# $cores cores; DT_BIND=${DT_BIND-(unset: library default)}; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-(unset)}"
sizes=("default:" "w256:--width 256 --layers 4")
# GPT-2 sizes: ours gets SIZE_ARGS without --arch (train_gpt2's flags), PyTorch with it.
[ "$gpt2" = 1 ] && sizes+=(
  "gpt2_small:--arch gpt2 --layers 2 --width 128 --heads 4 --vocab 512"
  "gpt2_124M:--arch gpt2 --layers 12 --width 768 --heads 12 --vocab 50304")
# Configurations: SIDE|PROCS|THREADS|BLAS (ours: THREADS = lib, the library's choice).
configs=("ours|1|lib|lib" "ours|1|lib|1" "ours|2|lib|lib"
         "torch|1|1|1" "torch|1|1|default" "torch|1|$cores|1" "torch|1|$cores|default"
         "torch|2|1|1" "torch|2|1|default")
declare -A got
for ((r = 0; r < reps; r++)); do
  load "round $((r + 1))"
  for s in "${sizes[@]}"; do
    size=${s%%:*}
    model=${s#*:}
    n=$steps w=5
    [ "$size" = w256 ] && n=$(( steps / 3 > 5 ? steps / 3 : 5 ))
    case "$size" in
      gpt2_small) n=6 w=2 ;;
      gpt2_124M) n=4 w=2 ;;
    esac
    for c in "${configs[@]}"; do
      IFS='|' read -r side np th blas <<<"$c"
      if [ "$side" = ours ] && [ "${size#gpt2}" != "$size" ]; then
        t=$(ours_gpt2 "${model#--arch gpt2 }" "$np" "$blas" "$n" "$w") || t=""
      elif [ "$side" = ours ]; then
        t=$(ours "$model" "$np" "$blas" "$n" "$w") || t=""
      else
        t=$(torch_run "$model" "$np" "$th" "$blas" "$n" "$w") || t=""
      fi
      got[$size|$c]="${got[$size|$c]:-} $t"
    done
  done
done
status=0
for s in "${sizes[@]}"; do
  size=${s%%:*}
  best_ours="" best_torch="" cfg_ours="" cfg_torch="" single=0 default=""
  for c in "${configs[@]}"; do
    IFS='|' read -r side np th blas <<<"$c"
    t=$(echo "${got[$size|$c]}" | median)
    if [ -z "$t" ]; then
      echo "case=gpt_vs_torch_config size=$size side=$side procs=$np threads=$th openblas=$blas failed=1"
      status=1
      continue
    fi
    echo "case=gpt_vs_torch_config size=$size side=$side procs=$np threads=$th openblas=$blas runs=$reps tokens_per_s=$t # runs:${got[$size|$c]}"
    name="procs=$np,threads=$th,openblas=$blas"
    if [ "$side" = ours ]; then
      [ "$np" = 1 ] && [ "$blas" = lib ] && default=$t
      [ "$np" = 1 ] && single=$(awk -v a="$single" -v b="$t" 'BEGIN { print (b > a ? b : a) }')
      if [ -z "$best_ours" ] || awk -v a="$t" -v b="$best_ours" 'BEGIN { exit !(a > b) }'; then
        best_ours=$t cfg_ours=$name
      fi
    elif [ -z "$best_torch" ] || awk -v a="$t" -v b="$best_torch" 'BEGIN { exit !(a > b) }'; then
      best_torch=$t cfg_torch=$name
    fi
  done
  dp=$(echo "${got[$size|ours|2|lib|lib]}" | median)
  if [ -z "$best_ours" ] || [ -z "$best_torch" ]; then
    echo "case=gpt_vs_torch size=$size failed=1"
    status=1
    continue
  fi
  awk -v s="$size" -v a="$best_ours" -v b="$best_torch" -v ca="$cfg_ours" -v cb="$cfg_torch" \
      -v dp="$dp" -v one="$single" -v d="$default" 'BEGIN {
    printf "case=gpt_vs_torch size=%s ours_best_tokens_per_s=%.1f ours_best=%s torch_best_tokens_per_s=%.1f torch_best=%s vs_torch=%.3f", s, a, ca, b, cb, a / b
    if (dp != "" && one > 0) printf " dp_vs_single=%.3f", dp / one
    if (d != "") printf " default_vs_best=%.3f", d / a
    printf "\n" }'
done
load "bench/run gpt --vs-torch end"
exit "$status"
