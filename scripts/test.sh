#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DCAST_ENABLE_CUDA=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
