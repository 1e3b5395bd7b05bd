#!/usr/bin/env bash
# Fetches, on a machine with network and apt (this project's Debian 12 machines), the Debian
# packages the build needs that a GPU machine without network may lack, into kit/debs/ (ignored
# by git, about 10 MB), and copies Fashion-MNIST into kit/datasets/ (30 MB, for the LRA runs).
# bench/gpu_session.sh unpacks the packages there into kit/root/ (no dpkg needed) and builds
# against that prefix. Carry kit/ to the GPU machine with the working tree.
#
#   bench/gpu_kit.sh            # then, on the GPU machine: bench/gpu_session.sh
#
# Only libraries and headers travel; the compilers, CMake and the CUDA toolkit are the GPU
# machine's own. The libraries are Debian 12's (glibc 2.36): they run on any newer glibc.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(libfmt-dev libfmt9 nlohmann-json3-dev libgtest-dev libpng-dev libpng16-16 zlib1g-dev zlib1g
          libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libgomp1)
mkdir -p kit/debs
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ]; then
  apt-get update -qq
fi
(cd kit/debs && apt-get download "${packages[@]}")
du -sh kit/debs
# Fashion-MNIST (30 MB, Debian's dataset-fashion-mnist) for the LRA runs (gpu_session.sh --lra)
if [ -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p kit/datasets/fashion-mnist
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz kit/datasets/fashion-mnist/
  du -sh kit/datasets
fi
echo "kit: ${#packages[@]} packages in kit/debs; carry kit/ with the working tree"
