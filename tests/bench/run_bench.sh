#!/usr/bin/env bash
# One benchmark as a test of the bench suite: `bench/run NAME ARGS...` on the build meson just
# made (DT_BENCH_NO_BUILD=1), its output shown; fails on a non-zero exit, on no result line
# (`case=...`), or on a result line with an `error=` field or a failed check (`check=FAIL...`).
# Exit 77 (a benchmark that cannot run here, as multihost without network namespaces) is a
# skip. Usage: tests/bench/run_bench.sh SOURCE_ROOT BUILD_DIR NAME [ARGS...]
set -uo pipefail
src=${1:?usage: run_bench.sh SOURCE_ROOT BUILD_DIR NAME [ARGS...]}
build=${2:?usage: run_bench.sh SOURCE_ROOT BUILD_DIR NAME [ARGS...]}
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
BUILD_DIR=$build DT_BENCH_NO_BUILD=1 "$src/bench/run" "$@" >"$out"
rc=$?
cat "$out"
[ "$rc" -ne 77 ] || { echo "bench/run $*: skipped (exit 77)"; exit 77; }
[ "$rc" -eq 0 ] || { echo "bench/run $*: exit $rc" >&2; exit 1; }
grep -q '^case=' "$out" || { echo "bench/run $*: no result line (case=...)" >&2; exit 1; }
bad=$(grep -E '^case=.*( error=| check=FAIL)' "$out")
[ -z "$bad" ] || { echo "bench/run $*: failed cases:" >&2; echo "$bad" >&2; exit 1; }
echo "bench/run $*: $(grep -c '^case=' "$out") result lines, none failed"
