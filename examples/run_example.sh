#!/usr/bin/env bash
# The main job: trains the MLP example (examples/train_mlp.c, docs/examples.md) on the UCI
# digits over the 2x2 mesh examples/meshes/2x2.yaml, as 2 MPI processes with 2 CPU devices
# each (data parallel over `batch`, tensor parallel over `model`, ZeRO stage 1), checks the
# checkpoint it wrote and prints where the checkpoint, the curves and the plot are.
# Usage: examples/run_example.sh [BUILD_DIR] [--tour]
#   --tour   afterwards also run the mesh and checkpoint tours (mesh_demo, ckpt_tour)
# Environment: OUT (default BUILD_DIR/example) is where the run writes; NP (default 2) the
# number of processes; TRAIN_ARGS extra options for train_mlp (e.g. "--precision bf16").
# Processes start through BUILD_DIR/mpiexec, the launcher of the MPI that build links (Open MPI
# or MPICH, -Dmpi); on one host every rank inherits this environment (DT_CPU_DEVICES).
set -euo pipefail
build=${1:-build}
tour=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/env.sh"
build=$(cd "$build" && pwd)
mpiexec="$build/mpiexec"
[ -x "$mpiexec" ] || { echo "run_example: no $mpiexec: run ninja -C $build first" >&2; exit 1; }
out=${OUT:-$build/example}
np=${NP:-2}
mesh="$here/meshes/2x2.yaml"
devices=$((4 / np))
if [ $((devices * np)) -ne 4 ]; then
  echo "run_example: NP must be 1, 2 or 4 for the 2x2 mesh" >&2
  exit 2
fi

echo "== train_mlp: MLP on the UCI handwritten digits, mesh $mesh"
echo "   mpiexec -n $np, DT_CPU_DEVICES=$devices per process"
# shellcheck disable=SC2086
DT_CPU_DEVICES=$devices "$mpiexec" -n "$np" "$build/examples/train_mlp" \
  --mesh "$mesh" --out "$out" ${TRAIN_ARGS:-} | tee "$out.log"
result=$(tail -n 1 "$out.log")
ckpt=$(sed -n 's/.* checkpoint=\([^ ]*\) .*/\1/p' <<<"$result")
plot=$(sed -n 's/.* plot=\([^ ]*\)$/\1/p' <<<"$result")
rm -f "$out.log"

echo "== the checkpoint, read back with the dtensor tool"
"$build/tools/dtensor" ckpt verify "$ckpt"

if [ "$tour" = "--tour" ]; then
  echo "== mesh_demo: one process with 4 CPU devices"
  DT_CPU_DEVICES=4 "$build/examples/mesh_demo" "$here/meshes.yaml" demo
  echo "== mesh_demo: mpiexec -n 2, 2 CPU devices each"
  DT_CPU_DEVICES=2 "$mpiexec" -n 2 "$build/examples/mesh_demo" "$here/meshes.yaml" demo
  echo "== ckpt_tour: save on 2 processes x 2 devices, restore onto other meshes and layouts"
  tour_dir=$(mktemp -d)
  trap 'rm -rf "$tour_dir"' EXIT
  DT_CPU_DEVICES=2 "$mpiexec" -n 2 "$build/examples/ckpt_tour" \
    "$here/ckpt_meshes.yaml" "$tour_dir/ckpt" tour
  "$build/tools/dtensor" ckpt verify "$tour_dir/ckpt"
fi

echo "== done"
echo "checkpoint: $ckpt"
echo "            (to continue: $build/examples/train_mlp --resume $ckpt --out $out --steps 600)"
echo "curves:     $out/curves.csv"
echo "plot:       $plot"
