#!/usr/bin/env bash
# Installs, with apt-get, the Debian packages libdtensor needs to build, test and run.
# Idempotent: when everything is present it prints nothing and exits 0.
set -euo pipefail

pkgs=(
  meson ninja-build pkg-config gcc g++
  libopenmpi-dev openmpi-bin
  libhwloc-dev libyaml-dev libcunit1-dev libdlpack-dev
  libjansson-dev libopenblas-dev
  libudev-dev zlib1g-dev
  python3 python3-numpy
)

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
