#!/usr/bin/env bash
# Runs bench_ops (the local kernels of ops/ against cblas_sgemm and memcpy; one process, no
# launcher): builds the target if missing, then prints key=value lines on stdout. Meant to be
# dispatched by `bench/run ops [options]`; options go to the program:
#   bench/ops.sh [--cases LIST] [--quick] [--reps N] [--kib LIST]
# (--kib: KiB per f32 operand of the elementwise and cast cases, default 1024,65536).
# Environment: BUILD_DIR (default build), OPENBLAS_NUM_THREADS (GEMM threads, both sides).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/ops.sh bench_ops
echo "# bench/ops start: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
"$build/bench/bench_ops" "$@" || status=$?
# The op definitions' generic path (dt_op_call, broadcasting, einsum): its own program.
[ -x "$build/bench/bench_opdef" ] || ninja -C "$build" bench/bench_opdef >/dev/null
quick=
for a in "$@"; do [ "$a" = --quick ] && quick=--quick; done
"$build/bench/bench_opdef" $quick || status=$?
echo "# bench/ops end: load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
