#!/usr/bin/env bash
# The main job: runs the example on this machine, once as one process with 4 CPU devices and
# once as 2 MPI processes with 2 CPU devices each. Usage: examples/run_example.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/env.sh"
echo "== one process, 4 CPU devices"
DT_CPU_DEVICES=4 "$build/examples/mesh_demo" "$here/meshes.yaml" demo
echo "== mpirun -np 2, 2 CPU devices each"
DT_CPU_DEVICES=2 mpirun -np 2 -x DT_CPU_DEVICES "$build/examples/mesh_demo" "$here/meshes.yaml" demo
echo "== checkpoint tour: save on 2 processes x 2 devices, restore onto other meshes and layouts"
ckpt_dir=$(mktemp -d)
trap 'rm -rf "$ckpt_dir"' EXIT
DT_CPU_DEVICES=2 mpirun -np 2 -x DT_CPU_DEVICES "$build/examples/ckpt_tour" \
  "$here/ckpt_meshes.yaml" "$ckpt_dir/ckpt" tour
"$build/tools/dtensor" ckpt verify "$ckpt_dir/ckpt"
