#!/usr/bin/env bash
# Builds the CUDA configuration here (build-cuda/) and gathers into .dev/ what the GPU checks
# need on a machine that has a GPU but not our Debian packages: the CUDA test and benchmark
# binaries, the shared libraries they load that such a machine may lack, and Open MPI's
# plugins for the runtime test. scripts/gpu_check.sh runs them there. docs/gpu.md explains.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
./scripts/setup.sh
if [ ! -f build-cuda/build.ninja ]; then
  meson setup build-cuda -Dcuda=enabled -Dtests=true -Dbuildtype=release >/dev/null
fi
ninja -C build-cuda tests/test_ops_cuda tests/test_ops_cuda_runtime bench/bench_ops_cuda >/dev/null
bins=(build-cuda/tests/test_ops_cuda build-cuda/tests/test_ops_cuda_runtime
      build-cuda/bench/bench_ops_cuda)
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
du -sh .dev
