#!/usr/bin/env bash
# Configures and builds cast (Release) into ./build, printing one progress line per compiled
# file (the full log is build.log). CUDA is used when nvcc is found; arguments starting with -D
# are CMake options (e.g. -DCAST_ENABLE_CUDA=OFF), others are targets (default: all).
#   scripts/build.sh [-DOPTION=VALUE ...] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
options=() targets=()
for a in "$@"; do
  case "$a" in -D*) options+=("$a") ;; *) targets+=(--target "$a") ;; esac
done
echo "build: configuring (log in build.log)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${options[@]}" > build.log 2>&1 || { cat build.log; exit 1; }
grep -E "^-- cast:" build.log || true
start=$(date +%s)
if cmake --build build -j"$(nproc)" "${targets[@]}" 2>&1 | tee -a build.log |
   { grep --line-buffered -E "^\[ *[0-9]+%\] (Building|Linking)" | sed -u -E 's| object CMakeFiles/[^/]+\.dir/(.+)\.o$| \1|' || true; }; then
  echo "build: ok in $(( $(date +%s) - start )) s"
else
  tail -n 60 build.log
  exit 1
fi
