#!/usr/bin/env bash
# The main job: trains the character-level GPT of examples/train_gpt.c (docs/examples.md) on
# the bundled first names over the 2x2 mesh examples/meshes/2x2.yaml, data parallel over
# `batch` (ZeRO stage 1, AdamW) and tensor parallel over `model` (heads, MLP, vocabulary):
# first as 2 MPI processes with 2 CPU devices each, which checkpoint at step 1000 through the
# checkpoint manager and stop; then as 4 processes with 1 device each, which resume from that
# checkpoint (the same mesh on another number of processes) and finish at step 2000. Then it
# verifies the checkpoint with the dtensor tool and prints where the checkpoints, the curves
# and the plot are (the plot spans both runs).
# Usage: examples/run_example.sh [BUILD_DIR] [--mlp] [--tour] [--targets]
#   --mlp    the quick run instead: the MLP of examples/train_mlp.c on the UCI digits, 2x2
#            mesh, NP processes (a few seconds)
#   --tour   afterwards also run the mesh and checkpoint tours (mesh_demo, ckpt_tour)
#   --targets  print the ninja targets this run needs and exit (./run.sh example builds them)
# Environment: OUT (default BUILD_DIR/example) is where the run writes; TRAIN_ARGS extra
# options for the trainer (e.g. "--precision bf16"); NP (--mlp only; default 2) the number of
# processes. Processes start through BUILD_DIR/mpiexec, the launcher of the MPI that build
# links (Open MPI or MPICH, -Dmpi); on one host every rank inherits this environment
# (DT_CPU_DEVICES).
set -euo pipefail
build=${1:-build}
shift || true
mlp=0
tour=0
list_targets=0
for a in "$@"; do
  case "$a" in
    --mlp) mlp=1 ;;
    --tour) tour=1 ;;
    --targets) list_targets=1 ;;
    *) echo "usage: examples/run_example.sh [BUILD_DIR] [--mlp] [--tour] [--targets]" >&2
       exit 2 ;;
  esac
done
if [ "$list_targets" = 1 ]; then  # what the run below starts (BUILD_DIR/mpiexec: meson setup)
  targets="tools/dtensor"
  if [ "$mlp" = 1 ]; then targets+=" examples/train_mlp"; else targets+=" examples/train_gpt"; fi
  if [ "$tour" = 1 ]; then targets+=" examples/mesh_demo examples/ckpt_tour"; fi
  echo "$targets"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/env.sh"
build=$(cd "$build" && pwd)
mpiexec="$build/mpiexec"
[ -x "$mpiexec" ] || { echo "run_example: no $mpiexec: run ninja -C $build first" >&2; exit 1; }
out=${OUT:-$build/example}
mesh="$here/meshes/2x2.yaml"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if [ "$mlp" = 1 ]; then
  np=${NP:-2}
  devices=$((4 / np))
  if [ $((devices * np)) -ne 4 ]; then
    echo "run_example: NP must be 1, 2 or 4 for the 2x2 mesh" >&2
    exit 2
  fi
  echo "== train_mlp: MLP on the UCI handwritten digits, mesh $mesh"
  echo "   mpiexec -n $np, DT_CPU_DEVICES=$devices per process"
  # shellcheck disable=SC2086
  DT_CPU_DEVICES=$devices "$mpiexec" -n "$np" "$build/examples/train_mlp" \
    --mesh "$mesh" --out "$out" ${TRAIN_ARGS:-} | tee "$log"
  resume_hint="$build/examples/train_mlp --resume @CKPT@ --out $out --steps 600"
else
  rm -rf "$out/checkpoints"
  echo "== train_gpt: a character-level GPT (2 layers, width 64, 4 heads) on first names"
  echo "   mesh $mesh: batch 2 (data parallel, ZeRO stage 1) x model 2 (tensor parallel)"
  echo "   mpiexec -n 2, DT_CPU_DEVICES=2 per process; checkpoint at step 1000, then stop"
  # shellcheck disable=SC2086
  DT_CPU_DEVICES=2 "$mpiexec" -n 2 "$build/examples/train_gpt" --mesh "$mesh" --out "$out" \
    --ckpt-root "$out/checkpoints" --steps 2000 --stop-after 1000 --eval-every 250 \
    --samples 0 ${TRAIN_ARGS:-}
  echo "== the same job resumed from its checkpoint on 4 processes of 1 device each"
  echo "   mpiexec -n 4, DT_CPU_DEVICES=1 per process; steps 1001-2000"
  # shellcheck disable=SC2086
  DT_CPU_DEVICES=1 "$mpiexec" -n 4 "$build/examples/train_gpt" --mesh "$mesh" --out "$out" \
    --ckpt-root "$out/checkpoints" --resume latest --steps 2000 --eval-every 250 \
    ${TRAIN_ARGS:-} | tee "$log"
  resume_hint="$build/examples/train_gpt --ckpt-root $out/checkpoints --resume latest --out $out --steps 3000"
fi
result=$(tail -n 1 "$log")
ckpt=$(sed -n 's/.* checkpoint=\([^ ]*\) .*/\1/p' <<<"$result")
plot=$(sed -n 's/.* plot=\([^ ]*\)$/\1/p' <<<"$result")
echo "== the checkpoint, read back with the dtensor tool"
"$build/tools/dtensor" ckpt verify "$ckpt"
if [ "$tour" = 1 ]; then
  echo "== mesh_demo: one process with 4 CPU devices"
  DT_CPU_DEVICES=4 "$build/examples/mesh_demo" "$here/meshes.yaml" demo
  echo "== mesh_demo: mpiexec -n 2, 2 CPU devices each"
  DT_CPU_DEVICES=2 "$mpiexec" -n 2 "$build/examples/mesh_demo" "$here/meshes.yaml" demo
  echo "== ckpt_tour: save on 2 processes x 2 devices, restore onto other meshes and layouts"
  tour_dir=$(mktemp -d)
  trap 'rm -rf "$tour_dir"; rm -f "$log"' EXIT
  DT_CPU_DEVICES=2 "$mpiexec" -n 2 "$build/examples/ckpt_tour" \
    "$here/ckpt_meshes.yaml" "$tour_dir/ckpt" tour
  "$build/tools/dtensor" ckpt verify "$tour_dir/ckpt"
fi
echo "== done"
echo "checkpoint: $ckpt"
echo "            (to continue: ${resume_hint//@CKPT@/$ckpt})"
echo "curves:     $out/curves.csv"
echo "plot:       $plot"
