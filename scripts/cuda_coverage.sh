#!/usr/bin/env bash
# The lines of the CUDA code that the host build's GPU suite executes (docs/cuda_host.md):
# builds the CUDA sources for the CPU with gcov instrumentation (BUILD, default build-host-cov/,
# -Dcuda=host -Db_coverage=true), runs suites cuda_host and cuda_host_slow there, and reports per
# file of ops/cuda/, runtime/cuda/ and the CUDA host files the lines executed (target: 90%),
# and every __global__ kernel never launched. Exit 1 when a kernel was never launched.
# Usage: scripts/cuda_coverage.sh [BUILD] [--fast]   (--fast: suite cuda_host only)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build-host-cov
suites=(--suite cuda_host --suite cuda_host_slow)
for a in "$@"; do
  case "$a" in
    --fast) suites=(--suite cuda_host) ;;
    *) dir=$a ;;
  esac
done
. ./scripts/env.sh >/dev/null
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" -Dcuda=host -Db_coverage=true -Dbuildtype=debug >"$dir.setup.log" 2>&1 ||
    { cat "$dir.setup.log" >&2; exit 1; }
fi
ninja -C "$dir" tests/test_ops_cuda tests/test_llama_cuda tests/test_device_kernels_cuda \
  tests/test_ops_transformer_cuda tests/test_attention_cuda \
  tests/cuda_host/test_cuda_host_checks tests/test_cuda_arguments tests/test_ops_cuda_runtime \
  tests/test_data_gpu tests/device/test_gpu_mesh tests/test_relayout_cases \
  tests/test_relayout_property examples/train_mlp tests/cuda_host/test_cuda_faults \
  tests/relayout/test_relayout_mismatch examples/train_gpt \
  tests/cuda_host/test_nccl_faults >/dev/null
find "$dir" -name '*.gcda' -delete
meson test -C "$dir" --no-rebuild --num-processes "$(nproc)" "${suites[@]}" >/dev/null ||
  { echo "cuda_coverage: tests failed (see $dir/meson-logs/testlog.txt)" >&2; exit 1; }
exec python3 scripts/cuda_coverage.py "$dir"
