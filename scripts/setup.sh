#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those missing.
# Safe to run again; non-interactive. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(cmake g++ make pkg-config libfmt-dev nlohmann-json3-dev libgtest-dev
          libpng-dev zlib1g-dev libomp-dev libopenblas-openmp-dev dataset-fashion-mnist
          clang libclang-rt-14-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
