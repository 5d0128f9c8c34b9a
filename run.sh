#!/usr/bin/env bash
# libdtensor's two entry points on a fresh machine:
#   ./run.sh example   install what is missing, build, run the main example
#   ./run.sh test      install what is missing, build, run the whole test suite
#                      (plain build, then AddressSanitizer+UBSan build, then the unit and MPI
#                      suites built against MPICH, then install tests of both)
#   ./run.sh bench NAME   run a benchmark (bench/run NAME)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

# Open MPI is the default MPI; the test command also checks the build against MPICH.
# The test command also installs Slurm for the slurm suite (tests/launch, docs/launch.md) and
# Node.js with npm for the text suite's JS reference tokenizers (tests/text, docs/text.md).
if [ "${1:-}" = test ]; then ./scripts/setup.sh openmpi mpich slurm node; else ./scripts/setup.sh; fi
# shellcheck source=scripts/env.sh
. ./scripts/env.sh

jobs=$(nproc 2>/dev/null || echo 2)

setup() {  # setup DIR [meson options...]: configure DIR once
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    echo "== meson setup $dir $* (log: $dir.setup.log)"
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; exit 1; }
  fi
}

configure() {  # configure DIR [meson options...]: set up and build everything there
  setup "$@"
  ninja -C "$1" -j "$jobs" >/dev/null || ninja -C "$1" -j 1
}

case "${1:-}" in
  example)
    # Only what the example runs (not the tests and benchmarks), with ninja's progress shown.
    setup build
    targets=$(./examples/run_example.sh build --targets)
    echo "== ninja -C build $targets"
    # shellcheck disable=SC2086
    ninja -C build -j "$jobs" $targets
    exec ./examples/run_example.sh build
    ;;
  test)
    configure build
    echo "== unit and MPI tests, and every benchmark at its smallest sizes (build/, suite bench)"
    meson test -C build --print-errorlogs --num-processes "$jobs"
    echo "== the same suite under AddressSanitizer and UndefinedBehaviorSanitizer (build-asan/)"
    # The black-box crash tests (suite crash: SIGKILL and a full disk) exercise the same code
    # as the round-trip tests and only slow down under the sanitizers; they run once above, as
    # the benchmarks (suite bench, not even defined in a sanitizer build). So do the 4-process
    # runs of the unit programs (suite np4: the same code as at 2 processes, on more devices;
    # they run above and against MPICH below). Built at -O2 with debug info (debugoptimized):
    # the instrumentation is the same as at -O0, the tests run faster.
    configure build-asan -Db_sanitize=address,undefined -Db_lundef=false \
      -Dbuildtype=debugoptimized
    meson test -C build-asan --print-errorlogs --num-processes "$jobs" --timeout-multiplier 3 \
      --no-suite crash --no-suite bench --no-suite np4
    echo "== the MPI and launch suites built against MPICH (build-mpich/, -Dmpi=mpich)"
    # The same C code against the other MPI and its launcher; the sanitizer and crash runs
    # above do not depend on which MPI it is (docs/mpi.md). The 4-process runs (suite np4)
    # run above under Open MPI: what differs between the MPIs (launcher, error handlers,
    # truncation, the first exit ending the job) shows at 2 processes, and MPICH's ranks
    # busy-poll, so 4 of them on 2 cores were the slowest part of this pass. Nor the
    # single-process programs of suite unit (the same code, no launcher, run in both passes
    # above): suite mpi, everything started through BUILD/mpiexec (its Python tests also run
    # the examples as one process, MPICH's singleton init), and suite launch, whose
    # launch_command checks the command of the linked MPI (not launch_restart: the multihost
    # namespaces, run above).
    configure build-mpich -Dmpi=mpich
    meson test -C build-mpich --print-errorlogs --num-processes "$jobs" \
      --suite mpi --suite launch --no-suite launch_restart --no-suite crash --no-suite np4
    echo "== the CUDA sources built for the CPU (-Dcuda=host): the GPU suite under ASan+UBSan,"
    echo "   the kernel tests under ThreadSanitizer (build-host-asan/, build-host-tsan/)"
    # docs/cuda_host.md. Each .cu file compiles as C++ and runs a block's threads as OS threads
    # over stand-ins of cudart, cuBLAS and NCCL, at small shapes; only the programs of suites
    # cuda_host and cuda_host_kernels are built (not the rest of the tests, examples, benchmarks),
    # at -O0, where the instrumentation costs least to compile.
    cuda_host_kernels="tests/test_ops_cuda tests/test_llama_cuda tests/test_device_kernels_cuda
      tests/test_ops_transformer_cuda tests/test_attention_cuda tests/cuda_host/test_cuda_host_checks"
    cuda_host_all="$cuda_host_kernels tests/test_cuda_arguments tests/test_ops_cuda_runtime
      tests/test_data_gpu tests/device/test_gpu_mesh tests/test_relayout_cases
      tests/cuda_host/test_cuda_faults tests/relayout/test_relayout_mismatch examples/train_mlp
      tests/cuda_host/test_nccl_faults examples/train_gpt"
    setup build-host-asan -Dcuda=host -Db_sanitize=address,undefined -Db_lundef=false \
      -Dbuildtype=debug
    cuda_host_all="$cuda_host_all tests/collective/test_alltoallv"  # dt_alltoallv (suite collective)
    # shellcheck disable=SC2086
    ninja -C build-host-asan -j "$jobs" $cuda_host_all >/dev/null
    meson test -C build-host-asan --no-rebuild --print-errorlogs --num-processes "$jobs" \
      --timeout-multiplier 3 --suite cuda_host
    setup build-host-tsan -Dcuda=host -Db_sanitize=thread -Db_lundef=false -Dbuildtype=debug
    # shellcheck disable=SC2086
    ninja -C build-host-tsan -j "$jobs" $cuda_host_kernels >/dev/null
    meson test -C build-host-tsan --no-rebuild --print-errorlogs --num-processes "$jobs" \
      --timeout-multiplier 3 --suite cuda_host_kernels
    echo "== install, then build a separate program with pkg-config (Open MPI, then MPICH)"
    ./tests/install/check_install.sh build
    ./tests/install/check_install.sh build-mpich
    echo "== all tests passed"
    ;;
  bench)
    shift
    exec ./bench/run "$@"
    ;;
  *)
    echo "usage: ./run.sh example | test | bench NAME" >&2
    exit 2
    ;;
esac
