#!/usr/bin/env bash
# Installs, with apt-get, the Debian packages libdtensor needs to build, test and run.
# Idempotent: when everything is present it prints nothing and exits 0.
# Usage: scripts/setup.sh [openmpi] [mpich] [slurm] [node]
#   which MPI implementations to install (default: openmpi, what `meson setup` picks when both
#   are present; `-Dmpi=mpich` builds against MPICH, docs/mpi.md). `run.sh test` asks for both,
#   and for slurm: Debian's Slurm daemons, client and munge for the slurm test suite
#   (tests/launch, docs/launch.md; the PMIx and PMI2 plugins come with slurm-wlm-basic-plugins),
#   and node: Node.js and npm for the JS reference tokenizers of tests/text (docs/text.md).
set -euo pipefail

pkgs=(
  meson ninja-build pkg-config gcc g++
  libhwloc-dev libyaml-dev libcunit1-dev libdlpack-dev
  libjansson-dev libopenblas-dev libpcre2-dev libicu-dev
  libudev-dev zlib1g-dev
  python3 python3-numpy
)
[ $# -gt 0 ] || set -- openmpi
for mpi in "$@"; do
  case "$mpi" in
    openmpi) pkgs+=(libopenmpi-dev openmpi-bin) ;;
    # The test command (./run.sh test) asks for both MPIs; its `reference` suite needs torch.
    mpich) pkgs+=(libmpich-dev mpich python3-torch) ;;   # mpiexec.mpich (Hydra), mpich.pc
    slurm) pkgs+=(slurmctld slurmd slurm-client munge) ;;
    # tests/text: the JS reference tokenizers (npm packages, installed by the tests on first
    # run). Debian's npm only where no npm is on the PATH: NodeSource's nodejs carries its own
    # and conflicts with Debian's.
    node) pkgs+=(nodejs); command -v npm >/dev/null || pkgs+=(npm) ;;
    *) echo "setup: unknown '$mpi' (openmpi, mpich, slurm or node)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
