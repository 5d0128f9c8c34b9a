# Sourced by bench/run and bench/*.sh: installs what is missing, sources scripts/env.sh,
# configures $BUILD_DIR (default build; release when it has to be created) and builds one
# benchmark target. Sets `build`, `exe` and `mpiexec` (BUILD_DIR/mpiexec: the launcher of the
# MPI that build links, Open MPI or MPICH, -Dmpi); defines `load` (prints a "# " line with the
# load average, since other work on the machine distorts the numbers).
#   bench_prepare NAME TARGET     e.g. bench_prepare bench/ckpt.sh bench_ckpt
# (DT_BENCH_NO_BUILD=1 skips the build step.)
bench_prepare() {
  local name=$1 target=$2
  cd "$root"
  ./scripts/setup.sh
  # shellcheck source=scripts/env.sh
  . ./scripts/env.sh
  build=${BUILD_DIR:-build}
  if [ ! -f "$build/build.ninja" ]; then
    echo "$name: configuring $build (release)" >&2
    meson setup "$build" -Dbuildtype=release >&2
  fi
  # DT_BENCH_NO_BUILD=1: the build is up to date (the bench test suite, which meson built).
  [ "${DT_BENCH_NO_BUILD:-0}" = 1 ] || ninja -C "$build" "bench/$target" >&2
  exe="$build/bench/$target"
  mpiexec="$build/mpiexec"
  export DT_BIND=${DT_BIND:-0}
}

load() { echo "# $1: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"; }
