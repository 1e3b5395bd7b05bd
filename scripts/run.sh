#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job:
# `cast train` with no options (short ListOps generated if missing, a small CAST model).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/cast info
./build/cast train
