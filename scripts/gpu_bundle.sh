#!/usr/bin/env bash
# Builds the CUDA configuration here (build-cuda/) and gathers into .dev/ what the GPU checks
# need on a machine that has a GPU but not our Debian packages: the CUDA kernel tests, the
# GPU-mesh test programs (the ones the suite also runs on the simulator), train_mlp, the
# benchmarks, the shared libraries they load that such a machine may lack, and Open MPI's
# plugins and launcher; and packs .dev/ into .dev.tar.gz, one file to carry there.
# scripts/gpu_check.sh runs them there. docs/gpu.md explains.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
./scripts/setup.sh
if [ ! -f build-cuda/build.ninja ]; then
  meson setup build-cuda -Dcuda=enabled -Dtests=true -Dbuildtype=release >/dev/null
fi
# The programs the suite registers with 'gpu': true (tests/*/meson.build) or runs on the
# simulator through its env (transport, ckpt_gpu, data_gpu_sim), and the rest.
gpu_tests=(tensor ops_spmd_matmul ops_spmd_ops optim_step optim_api optim_ckpt
           relayout_property relayout_cases barrier zero_mlp zero_synthetic zero_resume
           zero_offload optim_gpu_sim transport ckpt_gpu data_gpu_sim)
targets=(tests/test_ops_cuda tests/test_llama_cuda tests/test_device_kernels_cuda
         tests/test_ops_cuda_runtime tests/device/test_gpu_mesh
         tests/test_staging_pool
         examples/train_mlp bench/bench_ops_cuda bench/bench_device bench/bench_relayout
         bench/bench_zero)
for t in "${gpu_tests[@]}"; do targets+=("tests/test_$t"); done
ninja -C build-cuda "${targets[@]}" >/dev/null
bins=()
for t in "${targets[@]}"; do bins+=("build-cuda/$t"); done
rm -rf .dev
mkdir -p .dev/bin .dev/lib
cp "${bins[@]}" .dev/bin/
ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
# Every library the binaries and the MPI plugins load, except the C library itself, CUDA's
# own (found on the GPU machine) and the transports a single process never uses.
for f in "${bins[@]}" "$ompi_plugins"/*.so; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|/usr/local/cuda|fabric|libuc[mpst]|psm|infinipath|ibverbs|efa|rdmacm|libnl-|munge|common_(ucx|verbs|ofi)' |
  while read -r lib; do cp -L "$lib" .dev/lib/; done
ompi=.dev/ompi
mkdir -p "$ompi/bin" "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" "$ompi/share"
cp -L "$ompi_plugins"/*.so "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/"
cp -r /usr/share/openmpi "$ompi/share/"
cp -L /usr/bin/orted "$ompi/bin/" 2>/dev/null || true
for b in mpiexec.openmpi orterun prterun prted; do
  [ -e "/usr/bin/$b" ] && cp -L "/usr/bin/$b" "$ompi/bin/"
done
[ -e "$ompi/bin/mpiexec.openmpi" ] && ln -sf mpiexec.openmpi "$ompi/bin/mpiexec"
printf '%s\n' "${gpu_tests[@]}" > .dev/gpu_tests.txt
# One file to carry to the GPU machine (the device tool carries at most 64 MiB: .dev/ is about
# 85 MiB, the archive under 30); gpu_check.sh unpacks it there when .dev/ is missing.
tar -czf .dev.tar.gz .dev
du -sh .dev .dev.tar.gz
