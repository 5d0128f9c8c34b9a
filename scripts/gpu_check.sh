#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over the .dev/ bundle that
# scripts/gpu_bundle.sh made: the CUDA kernel tests (against the CPU kernels), the runtime's
# CUDA test, and bench_ops_cuda. Writes logs under $OUT (or ./gpu-out). docs/gpu.md.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
dev=$root/.dev
libdir=$(mktemp -d)
# Use the machine's own copy of a library where it has one; ours only where it has none.
for f in "$dev"/lib/*; do
  n=$(basename "$f")
  ldconfig -p | grep -q " $n " || ln -sf "$f" "$libdir/$n"
done
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  if ! ldconfig -p | grep -q " $n " && [ ! -e "/usr/local/cuda/lib64/$n" ]; then
    f=$(find / -xdev \( -name "$n" -o -name "$n.*" \) -not -path '/proc/*' 2>/dev/null | head -n 1)
    [ -n "$f" ] && ln -sf "$f" "$libdir/$n"
  fi
done
export LD_LIBRARY_PATH=$libdir
export OPAL_PREFIX=$dev/ompi PATH=$dev/ompi/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 DT_BIND=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  ls "$libdir"
  for b in "$dev"/bin/*; do ldd "$b" | grep 'not found' && echo "MISSING for $b"; done
} 2>&1 | tee "$out/env.txt"
rc=0
run() {  # run NAME CMD...
  local name=$1; shift
  echo "== $name"
  timeout 240 "$@" >"$out/$name.txt" 2>&1
  local s=$?
  tail -n 25 "$out/$name.txt"
  echo "== $name exit $s"
  [ $s -eq 0 ] || rc=1
}
run test_ops_cuda "$dev/bin/test_ops_cuda"
run test_ops_cuda_runtime "$dev/bin/test_ops_cuda_runtime"
run bench_ops_cuda "$dev/bin/bench_ops_cuda" --reps 20
exit $rc
