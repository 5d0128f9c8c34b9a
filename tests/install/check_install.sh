#!/usr/bin/env bash
# Installs libdtensor from a configured build dir into a scratch prefix, then builds and runs a
# separate program (consumer.c) using only `pkg-config --cflags --libs dtensor`, shared and
# static, and checks that dtensor.pc names the MPI the library links (Open MPI or MPICH, -Dmpi)
# as ldd sees it; then builds a separate CMake project (tests/install/cmake) with
# find_package(dtensor CONFIG) and runs it. Usage: tests/install/check_install.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check_install.sh BUILD_DIR}
src=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT

# Stage the install under a scratch DESTDIR, then relocate it there by rewriting the .pc
# file's prefix (a sysroot would also rewrite the absolute CUDA library paths).
meson install -C "$build" --destdir "$prefix" --quiet >/dev/null
pc=$(find "$prefix" -name dtensor.pc | head -n 1)
[ -n "$pc" ] || { echo "install test: dtensor.pc was not installed" >&2; exit 1; }
orig=$(sed -n 's/^prefix=//p' "$pc")
sed -i "s|^prefix=.*|prefix=$prefix$orig|" "$pc"
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(dirname "$(dirname "$pc")")

# Libs.private once per word: pkg-config removes no duplicate, and meson once listed every
# module's copy of the CUDA libraries (libcudart.so and libnccl.so ten times each).
dups=$(sed -n 's/^Libs\.private: *//p' "$pc" | tr -s ' ' '\n' | sed '/^$/d' | sort | uniq -d)
[ -z "$dups" ] ||
  { echo "install test: dtensor.pc's Libs.private repeats: $(echo $dups)" >&2; exit 1; }

# The README's install commands and its consumer's build line, as this test runs them (the
# install staged under DESTDIR above; the program built by the README's own line).
readme="$src/../../README.md"
grep -qxF 'meson install -C build' "$readme" ||
  { echo "install test: README.md shows no 'meson install -C build' line" >&2; exit 1; }
readme_cc=$(grep -m 1 '^cc app\.c ' "$readme" | sed 's/ *#.*//')
case "$readme_cc" in
  *'-Wl,-rpath,$(pkg-config --variable=libdir dtensor)'*) ;;
  *) echo "install test: README.md's 'cc app.c' line sets no rpath: $readme_cc" >&2; exit 1 ;;
esac
(cd "$prefix" && cp "$src/consumer.c" app.c && eval "$readme_cc -o consumer" && rm app.c)
[ "$(pkg-config --variable=libdir dtensor)" = "$libdir" ] ||
  { echo "install test: pkg-config's libdir is not $libdir" >&2; exit 1; }
grep -qF "$libdir/libdtensor.so" <<<"$(ldd "$prefix/consumer")" ||
  { echo "install test: the README's consumer does not load $libdir/libdtensor.so" >&2; exit 1; }
"$prefix/consumer"

# Without an rpath the loader is told where the library is by LD_LIBRARY_PATH (the README's
# other way).
cflags=$(pkg-config --cflags dtensor)
libs=$(pkg-config --libs dtensor)
cc -std=c11 -Wall -Wextra -Werror $cflags "$src/consumer.c" -o "$prefix/consumer_norpath" $libs
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$prefix/consumer_norpath"

# The MPI: dtensor.pc's `mpi` variable and Requires.private against the library ldd loads, and
# its `mpiexec` against what that launcher says it is.
mpi=$(pkg-config --variable=mpi dtensor)
case "$mpi" in
  openmpi) soname='libmpi\.so'; pcname=ompi-c; launcher='Open ?MPI|OpenRTE' ;;
  mpich) soname='libmpich\.so'; pcname=mpich; launcher='HYDRA' ;;
  *) echo "install test: dtensor.pc names no known MPI (mpi=$mpi)" >&2; exit 1 ;;
esac
# (Whole outputs first: grep -q stops reading early, which pipefail would count as a failure.)
loaded=$(ldd "$prefix/consumer")
grep -Eq "^[[:space:]]*$soname" <<<"$loaded" ||
  { echo "install test: dtensor.pc says $mpi, but the library loads: $loaded" >&2; exit 1; }
grep -qx "$pcname" <<<"$(pkg-config --print-requires-private dtensor)" ||
  { echo "install test: dtensor.pc does not require $pcname" >&2; exit 1; }
grep -Eq "$launcher" <<<"$("$(pkg-config --variable=mpiexec dtensor)" --version 2>&1)" ||
  { echo "install test: dtensor.pc's mpiexec is not $mpi's launcher" >&2; exit 1; }

libs_static=$(pkg-config --libs --static dtensor)
cc -std=c11 -Wall -Wextra -Werror $cflags "$src/consumer.c" -o "$prefix/consumer_static" \
   "$libdir/libdtensor.a" $libs_static
"$prefix/consumer_static"
echo "install test: shared and static consumers built with pkg-config and ran ($mpi)"

# CMake: a separate project finds the same install through its package config alone
# (libdir/cmake/dtensor, relocatable: nothing rewritten), and its program, which also calls
# MPI directly, links the MPI the library links and runs as 1 and 2 processes.
if command -v cmake >/dev/null 2>&1; then
  cdir=$(find "$prefix" -name dtensorConfig.cmake -path '*/cmake/dtensor/*' | head -n 1)
  [ -n "$cdir" ] || { echo "install test: dtensorConfig.cmake was not installed" >&2; exit 1; }
  [ -f "$(dirname "$cdir")/dtensorConfigVersion.cmake" ] ||
    { echo "install test: dtensorConfigVersion.cmake was not installed" >&2; exit 1; }
  cb="$prefix/cmake-build"
  cmake -S "$src/cmake" -B "$cb" -DCMAKE_PREFIX_PATH="$prefix$orig" >"$prefix/cmake.log" 2>&1 ||
    { cat "$prefix/cmake.log" >&2; echo "install test: cmake configure failed" >&2; exit 1; }
  cmake --build "$cb" >>"$prefix/cmake.log" 2>&1 ||
    { cat "$prefix/cmake.log" >&2; echo "install test: cmake build failed" >&2; exit 1; }
  { read -r cmpi; read -r cmpiexec; } <"$cb/dtensor_mpi.txt"
  [ "$cmpi" = "$mpi" ] && [ "$cmpiexec" = "$(pkg-config --variable=mpiexec dtensor)" ] ||
    { echo "install test: the CMake package says $cmpi ($cmpiexec), dtensor.pc $mpi" >&2; exit 1; }
  loaded=$(ldd "$cb/cmake_consumer")
  grep -Eq "^[[:space:]]*$soname" <<<"$loaded" ||
    { echo "install test: the CMake consumer does not load $mpi: $loaded" >&2; exit 1; }
  grep -q "$prefix$orig" <<<"$(grep -F libdtensor <<<"$loaded")" ||
    { echo "install test: the CMake consumer does not load the installed libdtensor: $loaded" >&2
      exit 1; }
  # (CMake's build-tree rpath names the installed library's directory.)
  "$cb/cmake_consumer"
  "$cmpiexec" -n 2 "$cb/cmake_consumer"
  echo "install test: a CMake project built with find_package(dtensor CONFIG) and ran ($mpi)"
else
  echo "install test: no cmake here, the CMake package config is not tested" >&2
fi
