#!/usr/bin/env bash
# Configures and builds cast (Release) into ./build. CUDA is used when nvcc is found;
# pass -DCAST_ENABLE_CUDA=OFF (or any other CMake option) as arguments to change that.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" >> build.log 2>&1 || { tail -n 60 build.log; exit 1; }
echo "build: ok (log in build.log)"
