#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over the .dev/ bundle that
# scripts/gpu_bundle.sh made (unpacked from .dev.tar.gz when only that was carried): the CUDA
# kernel tests (against the CPU kernels), the GPU-mesh test programs on the real GPU (one
# process with 4 logical devices, then 2 and 4 processes sharing it), train_mlp --device gpu,
# and the benchmarks. Logs under $OUT (or ./gpu-out). Output, all key=value:
#   check=NAME status=pass|fail|skip exit=N seconds=S [reason=...]   one per step
#   bench=NAME ...                                                  the benchmarks' lines
#   result=train_mlp_gpu... accuracy=...                            train_mlp's result
#   gpu_check kind=K status=S pass=N fail=N skip=N seconds=S        last
# Exit 0 when every step passed, 77 when none failed but some skipped, 1 when one failed.
# Skips are never passes: with GPU_KIND=cuda (the default) and no GPU listed by nvidia-smi,
# every step is status=skip reason=no-gpu without running; a program exiting 77 is a skip.
# Time: the steps share CHECK_BUDGET_S seconds (default 420, so a run stays within 8
# minutes); each step's timeout is what is left (at most 240 s), and the steps after the
# budget is spent are status=skip reason=budget.
# GPU_KIND=sim runs the same steps (but the CUDA-only ones) on the simulated accelerator, to
# try the script on a machine without a GPU. docs/gpu.md.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
dev=$root/.dev
if [ ! -d "$dev" ] && [ -f "$root/.dev.tar.gz" ]; then
  tar -C "$root" -xzf "$root/.dev.tar.gz" || { echo "gpu_check status=fail reason=bad-bundle"; exit 1; }
fi
if [ ! -d "$dev/bin" ]; then
  echo "gpu_check status=fail reason=no-bundle (run scripts/gpu_bundle.sh first)"
  exit 1
fi
start=$SECONDS
budget=${CHECK_BUDGET_S:-420}
libdir=$(mktemp -d)
# Use the machine's own copy of a library where it has one; ours only where it has none.
for f in "$dev"/lib/*; do
  n=$(basename "$f")
  ldconfig -p | grep -q " $n " || ln -sf "$f" "$libdir/$n"
done
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  if ! ldconfig -p | grep -q " $n " && [ ! -e "/usr/local/cuda/lib64/$n" ]; then
    f=$(timeout 30 find / -xdev \( -name "$n" -o -name "$n.*" \) -not -path '/proc/*' 2>/dev/null | head -n 1)
    [ -n "$f" ] && ln -sf "$f" "$libdir/$n"
  fi
done
export LD_LIBRARY_PATH=$libdir
export OPAL_PREFIX=$dev/ompi PATH=$dev/ompi/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 DT_BIND=0
kind=${GPU_KIND:-cuda}
export DT_GPU=$kind DT_TEST_SRCDIR=$root/tests
gpu_ok=1
{
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  else
    echo "no nvidia-smi"
  fi

  ls "$libdir"
  for b in "$dev"/bin/*; do ldd "$b" | grep 'not found' && echo "MISSING for $b"; done
} 2>&1 | tee "$out/env.txt"
if [ "$kind" = cuda ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  gpu_ok=0
  echo "no usable GPU (nvidia-smi lists none): every step is a skip"
fi
npass=0 nfail=0 nskip=0
# step NAME KIND CMD...: runs CMD with what is left of the budget (at most 240 s), its output
# in $OUT/NAME.txt; KIND test shows the log's tail, bench its key=value lines. 0 pass, 77 skip.
step() {
  local name=$1 what=$2; shift 2
  echo "== $name"
  local left=$((budget - (SECONDS - start))) reason=""
  [ $gpu_ok -eq 1 ] || reason=no-gpu
  [ -n "$reason" ] || [ $left -ge 15 ] || reason=budget
  if [ -n "$reason" ]; then
    echo "check=$name status=skip exit=77 seconds=0 reason=$reason"
    nskip=$((nskip + 1))
    return
  fi
  [ $left -le 240 ] || left=240
  local t0=$SECONDS
  timeout -k 10 "$left" "$@" >"$out/$name.txt" 2>&1 </dev/null
  local s=$? status=fail extra=""
  if [ "$what" = bench ]; then
    sed "s/^/bench=$name /" "$out/$name.txt" | grep '=' | grep -v '^bench=[^ ]* #'
  else
    tail -n 12 "$out/$name.txt"
  fi
  [ $s -eq 0 ] && status=pass
  [ $s -eq 77 ] && status=skip
  [ $s -eq 124 ] || [ $s -eq 137 ] && extra=" reason=timeout-${left}s"
  echo "check=$name status=$status exit=$s seconds=$((SECONDS - t0))$extra"
  case $status in pass) npass=$((npass + 1)) ;; skip) nskip=$((nskip + 1)) ;; *) nfail=$((nfail + 1)) ;; esac
}
run() { local name=$1; shift; step "$name" test "$@"; }
bench() { local name=$1; shift; step "$name" bench "$@"; }
# train_mlp NAME CMD...: run, then its accuracy as result=NAME accuracy=...
train() {
  local name=$1; shift
  run "$name" "$@"
  [ -f "$out/$name.txt" ] && grep -h '^result' "$out/$name.txt" | sed "s/^result /result=$name /" || true
}
mpirun=("$dev/ompi/bin/mpiexec" --oversubscribe -n 2)

if [ "$kind" = cuda ]; then
  run test_ops_cuda "$dev/bin/test_ops_cuda"
  run test_llama_cuda "$dev/bin/test_llama_cuda"
  run test_device_kernels_cuda "$dev/bin/test_device_kernels_cuda"
fi
DT_GPU_DEVICES=4 run test_ops_gpu_runtime "$dev/bin/test_ops_cuda_runtime"
# The GPU-mesh programs as the suite runs them on the simulator, here on the real GPU.
while read -r t; do
  case "$t" in
    optim_gpu_sim) DT_GPU_DEVICES=4 run "gpu_$t" "$dev/bin/test_$t" ;;
    # One GPU device: on CUDA a one-rank NCCL communicator moves boxes (issue 12).
    transport) DT_GPU_DEVICES=1 DT_CPU_DEVICES=1 run "gpu_$t" "$dev/bin/test_$t" ;;
    *) DT_TEST_DEVICE=gpu DT_GPU_DEVICES=4 DT_CPU_DEVICES=4 run "gpu_$t" "$dev/bin/test_$t" ;;
  esac
done < "$dev/gpu_tests.txt"
DT_GPU_DEVICES=4 DT_CPU_DEVICES=2 run gpu_mesh "$dev/bin/test_gpu_mesh"
# Two processes sharing the GPU: pieces cross processes staged through host buffers.
for t in relayout_cases zero_mlp; do
  DT_TEST_DEVICE=gpu DT_GPU_DEVICES=2 DT_CPU_DEVICES=2 run "gpu_${t}_np2" "${mpirun[@]}" "$dev/bin/test_$t"
done
# dt_save/dt_restore of GPU tensors from two processes (4 devices each, as the suite runs it:
# its host-memory bound assumes 8 MiB per client).
DT_GPU_DEVICES=4 DT_CPU_DEVICES=2 run gpu_ckpt_gpu_np2 "${mpirun[@]}" "$dev/bin/test_ckpt_gpu"
# Four processes sharing it (the staged transport; forced, in 64 KiB chunks, for the
# relayouts), the transport test at 2, the GPU and CPU meshes across processes.
mpirun4=("$dev/ompi/bin/mpiexec" --oversubscribe -n 4)
for t in relayout_cases zero_mlp; do
  DT_TEST_DEVICE=gpu DT_GPU_DEVICES=1 DT_CPU_DEVICES=1 DT_TRANSPORT=staged DT_STAGED_CHUNK_KB=64 \
    run "gpu_${t}_np4_staged" "${mpirun4[@]}" "$dev/bin/test_$t"
done
DT_GPU_DEVICES=1 DT_CPU_DEVICES=1 run gpu_transport_np2 "${mpirun[@]}" "$dev/bin/test_transport"
# The staged transport's pool of page-locked staging: a second relayout allocates none.
DT_TEST_DEVICE=gpu DT_GPU_DEVICES=2 DT_CPU_DEVICES=2 DT_TRANSPORT=staged \
  run gpu_staging_pool_np2 "${mpirun[@]}" "$dev/bin/test_staging_pool"
DT_GPU_DEVICES=2 DT_CPU_DEVICES=1 run gpu_mesh_np2 "${mpirun[@]}" "$dev/bin/test_gpu_mesh"
DT_GPU_DEVICES=4 train train_mlp_gpu "$dev/bin/train_mlp" --device gpu --quiet \
  --mesh "$root/examples/meshes/2x2.yaml" --data "$root/examples/data/digits.csv.gz" \
  --out "$out/train_mlp_gpu"
DT_GPU_DEVICES=2 train train_mlp_gpu_np2 "${mpirun[@]}" "$dev/bin/train_mlp" --device gpu --quiet \
  --mesh "$root/examples/meshes/2x2.yaml" --data "$root/examples/data/digits.csv.gz" \
  --out "$out/train_mlp_gpu_np2"
DT_GPU_DEVICES=1 train train_mlp_gpu_np4 "${mpirun4[@]}" "$dev/bin/train_mlp" --device gpu --quiet \
  --mesh "$root/examples/meshes/2x2.yaml" --data "$root/examples/data/digits.csv.gz" \
  --out "$out/train_mlp_gpu_np4"
if [ "$kind" = cuda ]; then
  bench bench_ops_cuda "$dev/bin/bench_ops_cuda" --reps 20
fi
DT_GPU_DEVICES=4 bench bench_device "$dev/bin/bench_device" --mib 16,64 --reps 10
# Cross-process GPU relayouts (staged: the processes share the GPU) against D2H + the MPI
# collective + H2D on the same bytes (bench/run relayout --device gpu).
DT_GPU_DEVICES=1 DT_CPU_DEVICES=1 bench bench_relayout_gpu_np2 "${mpirun[@]}" \
  "$dev/bin/bench_relayout" --device gpu --mib 16,64 --reps 5
# ZeRO's gradient reduction behind a backward pass (bench/run zero --cases overlap, issue 17):
# CPU devices, one per process, where this machine has a core per process and spare ones for
# the progress threads (the development machine's 2 cores are all busy computing; docs/bench.md).
DT_CPU_DEVICES=1 bench bench_zero_overlap_np2 "${mpirun[@]}" "$dev/bin/bench_zero" \
  --cases overlap --reps 20
DT_CPU_DEVICES=1 bench bench_zero_overlap_np4 "${mpirun4[@]}" "$dev/bin/bench_zero" \
  --cases overlap --reps 20
status=pass rc=0
[ $nskip -eq 0 ] || { status=skip; rc=77; }
[ $nfail -eq 0 ] || { status=fail; rc=1; }
echo "gpu_check kind=$kind status=$status pass=$npass fail=$nfail skip=$nskip seconds=$((SECONDS - start))"
exit $rc
