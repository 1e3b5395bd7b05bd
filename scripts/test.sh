#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, runs every test (the CPU
# suite, the CUDA-vs-CPU tests on the CUDA emulation, everything again under ASan and UBSan),
# then a short fuzzing run of every file reader.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DCAST_ENABLE_CUDA=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
# every reader of untrusted files under libFuzzer, 10 s per target (scripts/fuzz.sh)
scripts/fuzz.sh 10
