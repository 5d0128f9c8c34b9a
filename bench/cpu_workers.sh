#!/usr/bin/env bash
# The CPU workers (docs/devices.md, "CPU workers"): examples/train_gpt in one process on the
# 1x2 and 2x2 meshes (DT_CPU_DEVICES=2 and 4) with the workers off (DT_CPU_WORKERS=0) and on,
# against the 1x1 mesh, at the default model and at width 256 / 4 layers. The runs of a model
# are interleaved round by round (1x1, 1x2 off, 1x2 on, 2x2 off, 2x2 on), and each case
# reports the median of train_gpt's "tokens/s in training steps" over the rounds, so that the
# ratios come from the same stretch of machine time. Prints key=value lines:
#   model=... mesh=1x2 workers=on tokens_per_s=... on_vs_off=... vs_1x1=...
# and a "# " line with the load average before and after.
#   bench/cpu_workers.sh [--steps N] [--rounds R] [--quick] [--models default,w256]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/cpu_workers.sh [--steps N] [--rounds R] [--quick] [--models default,w256]
  --steps N    training steps per run (default 60; --quick: 15)
  --rounds R   interleaved rounds per model (default 3; --quick: 1)
  --models L   default (width 64, 2 layers) and/or w256 (width 256, 4 layers)
Environment: BUILD_DIR (default build), DT_BIND (default 0).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=60
rounds=3
models=default,w256
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || { usage; exit 2; }; steps=$2; shift 2 ;;
    --rounds) [ $# -ge 2 ] || { usage; exit 2; }; rounds=$2; shift 2 ;;
    --models) [ $# -ge 2 ] || { usage; exit 2; }; models=$2; shift 2 ;;
    --quick) steps=15; rounds=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/cpu_workers.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done
case "$steps$rounds" in *[!0-9]*) echo "bench/cpu_workers.sh: bad number" >&2; exit 2 ;; esac

cd "$root"
# shellcheck source=scripts/env.sh
. ./scripts/env.sh
build=${BUILD_DIR:-build}
[ "${DT_BENCH_NO_BUILD:-0}" = 1 ] || ninja -C "$build" examples/train_gpt >&2
export DT_BIND=${DT_BIND:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load() { echo "# $1: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"; }

# run MESH DEVICES WORKERS MODEL_ARGS...: prints train_gpt's training tokens/s.
run() {
  local mesh=$1 devices=$2 workers=$3
  shift 3
  DT_CPU_DEVICES=$devices DT_CPU_WORKERS=$workers "$build/examples/train_gpt" \
    --mesh "examples/meshes/$mesh.yaml" --steps "$steps" --eval-every 100000 --samples 0 \
    --warmup 10 --out "$tmp/out" "$@" 2>&1 |
    sed -n 's/^done: .* \([0-9.]*\) tokens\/s in training steps.*/\1/p'
}

median() {
  sort -g | awk '{v[NR] = $1}
    END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

load start
cases="1x1:1:0 1x2:2:0 1x2:2:1 2x2:4:0 2x2:4:1"
for model in ${models//,/ }; do
  case "$model" in
    default) margs=() ;;
    w256) margs=(--width 256 --layers 4) ;;
    *) echo "bench/cpu_workers.sh: unknown model '$model'" >&2; exit 2 ;;
  esac
  for r in $(seq "$rounds"); do
    for c in $cases; do
      IFS=: read -r mesh dev w <<<"$c"
      t=$(run "$mesh" "$dev" "$w" ${margs[@]+"${margs[@]}"})
      [ -n "$t" ] || { echo "bench/cpu_workers.sh: train_gpt $mesh gave no tokens/s" >&2; exit 1; }
      echo "$t" >>"$tmp/$model-$mesh-$w"
    done
  done
  one=$(median <"$tmp/$model-1x1-0")
  echo "model=$model mesh=1x1 workers=off tokens_per_s=$one"
  for mesh in 1x2 2x2; do
    off=$(median <"$tmp/$model-$mesh-0")
    on=$(median <"$tmp/$model-$mesh-1")
    echo "model=$model mesh=$mesh workers=off tokens_per_s=$off vs_1x1=$(ratio "$off" "$one")"
    echo "model=$model mesh=$mesh workers=on tokens_per_s=$on on_vs_off=$(ratio "$on" "$off")" \
      "vs_1x1=$(ratio "$on" "$one")"
  done
done
load end
