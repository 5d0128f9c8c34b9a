#!/usr/bin/env bash
# The in-memory checkpoints' cost (dt_memckpt, docs/recovery.md): train_gpt at its default size
# on 2 processes x 2 CPU devices (this host: each client's memory a directory of its own, so
# that every buddy copy crosses between processes), without in-memory checkpoints and with
# them every K steps, in alternating runs. Prints key=value lines: the step time without, the
# save time per step with K = 1 and K = 10 as a share of the step time (the saves after the
# first, whose agreement is once per job; median over the reps),
# the step time with them over the step time without (medians), and the memory each client
# holds. Run by bench/ckpt.sh (case memory), or alone:
#   bench/ckpt_mem.sh [--steps 60] [--reps 3] [--quick]   (--quick: 10 steps, once, K = 1)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=60
reps=3
ks="1 10"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --quick) steps=10; reps=1; ks=1; shift ;;  # checks that it runs: K = 1 only
    *) echo "bench/ckpt_mem.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/ckpt_mem.sh bench_ckpt
[ "${DT_BENCH_NO_BUILD:-0}" = 1 ] || ninja -C "$build" examples/train_gpt >&2
train="$build/examples/train_gpt"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-ckpt-mem.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
load bench/ckpt_mem.sh

# One run: its output (the program's own figures).
one() {  # one K (0: none)
  local more=()
  [ "$1" = 0 ] || more=(--mem-ckpt-every "$1")
  DT_CPU_DEVICES=2 DT_MEMCKPT_DIR="$tmp/mem-%c" DT_JOB_ID="bench$1" "$mpiexec" -n 2 \
    ${MPIRUN_ARGS:-} "$train" --steps "$steps" --eval-every 1000000 --ckpt-every 0 \
    --out "$tmp/out$1" "${more[@]}" 2>&1
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

: >"$tmp/base" ; : >"$tmp/k1" ; : >"$tmp/k10" ; : >"$tmp/s1" ; : >"$tmp/s10"
bytes=0
for _ in $(seq "$reps"); do
  out=$(one 0)
  # "done: step N (...), T tokens/s in training steps": 64 x 16 tokens per step.
  echo "$out" | sed -n 's/.*, \([0-9.]*\) tokens\/s in training steps/\1/p' |
    awk '{ printf "%.4f\n", 1000 * 1024 / $1 }' >>"$tmp/base"
  for k in $ks; do
    out=$(one "$k")
    echo "$out" | sed -n "s/.* saves, [0-9.]* ms per save, \([0-9.]*\)% of the training steps' time.*/\1/p" >>"$tmp/k$k"
    echo "$out" | sed -n 's/.*, \([0-9.]*\) tokens\/s in training steps/\1/p' |
      awk '{ printf "%.4f\n", 1000 * 1024 / $1 }' >>"$tmp/s$k"
    bytes=$(echo "$out" | sed -n 's/.*ms); \([0-9]*\) bytes per client in memory.*/\1/p')
  done
done
echo "memckpt_step_ms_without=$(median <"$tmp/base")"
echo "memckpt_cost_pct_k1=$(median <"$tmp/k1")"
[ ! -s "$tmp/k10" ] || echo "memckpt_cost_pct_k10=$(median <"$tmp/k10")"
# The whole step with the saves against the step without (medians of the same reps): what
# the save costs outside its own call too (the copy progressed inside the step's MPI calls,
# the leader's commit thread competing for a core).
base_ms=$(median <"$tmp/base")
for k in $ks; do
  echo "memckpt_step_ratio_k$k=$(median <"$tmp/s$k" | awk -v b="$base_ms" '{ printf "%.4f", $1 / b }')"
done
echo "memckpt_bytes_per_client=$bytes"
