#!/usr/bin/env bash
# Runs bench_ckpt (docs/bench.md): builds it if missing, saves the resharding source from
# 2 processes x 2 CPU devices, then times save / restore / resharding restore on 2 processes x 1
# device against the same bytes written by the same processes with a crash-safe
# write+fsync+rename and with a plain write+fsync, and read with a plain read.
# Results on stdout as key=value lines; build output and launcher messages on stderr.
# Case memory (bench/ckpt_mem.sh): the in-memory checkpoints' cost per training step and
# memory per client (docs/recovery.md).
#   bench/ckpt.sh [--mib 1024] [--reps 3] [--quick] [--cases save,stall,restore,reshard,memory]
#                 [--cache cold,warm] [--dir DIR] [--keep] [--verbose]
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: bench/ckpt.sh [options]
  --mib N        checkpoint size in MiB over both processes (default 1024)
  --reps N       timed repetitions of each (default 3); --quick: 1
  --cases LIST   save,stall,restore,reshard,memory (default all)
  --cache LIST   cold,warm: how the restores find the page cache (default both)
  --dir DIR      where the files go (default BUILD_DIR/bench-ckpt.tmp; needs 4 x the size free)
  --keep         keep the files afterwards
  --verbose      also print every repetition's times (lines starting with #)
Environment: BUILD_DIR (default build), DT_BIND (default 0), MPIRUN_ARGS (extra launcher args).
USAGE
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mib=1024
cases=save,stall,restore,reshard,memory
mem_extra=()
dir=""
keep=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mib) [ $# -ge 2 ] || { usage; exit 2; }; mib=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || { usage; exit 2; }; extra+=(--reps "$2"); mem_extra+=(--reps "$2"); shift 2 ;;
    --cases) [ $# -ge 2 ] || { usage; exit 2; }; cases=$2; shift 2 ;;
    --cache) [ $# -ge 2 ] || { usage; exit 2; }; extra+=(--cache "$2"); shift 2 ;;
    --dir) [ $# -ge 2 ] || { usage; exit 2; }; dir=$2; shift 2 ;;
    --quick) extra+=(--quick); mem_extra+=(--quick); shift ;;
    --verbose) extra+=(--verbose); shift ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench/ckpt.sh: unknown option '$1'" >&2; usage; exit 2 ;;
  esac
done

# shellcheck source=bench/prepare.sh
. "$root/bench/prepare.sh"
bench_prepare bench/ckpt.sh bench_ckpt

dir=${dir:-$build/bench-ckpt.tmp}
mkdir -p "$dir"
[ "$keep" = 1 ] || trap 'rm -rf "$dir"' EXIT
echo "# bench/ckpt.sh: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); files in" \
     "$dir ($(df -h --output=fstype,avail "$dir" | tail -1 | xargs))"

status=0
case ",$cases," in
  *,reshard,*)
    # shellcheck disable=SC2086
    DT_CPU_DEVICES=2 "$mpiexec" -n 2 ${MPIRUN_ARGS:-} "$exe" --cases source --mib "$mib" \
      --dir "$dir" >&2 || status=1 ;;
esac
file_cases=$(echo ",$cases," | sed 's/,memory,/,/g; s/^,//; s/,$//')
if [ -n "$file_cases" ]; then
  # shellcheck disable=SC2086
  DT_CPU_DEVICES=1 "$mpiexec" -n 2 ${MPIRUN_ARGS:-} "$exe" --cases "$file_cases" --mib "$mib" \
    --dir "$dir" ${extra[@]+"${extra[@]}"} || status=1
fi
# At the bench suite's sizes (--mib below 64) the memory case runs as --quick (one short
# repetition of each run): it checks that it runs, as the suite does.
[ "$mib" -ge 64 ] || mem_extra+=(--quick)
case ",$cases," in
  *,memory,*) "$root/bench/ckpt_mem.sh" ${mem_extra[@]+"${mem_extra[@]}"} \
                || status=1 ;;
esac
exit "$status"
