#!/usr/bin/env bash
# The README's first command: installs what is missing, builds the binary, and runs the main
# job: `cast train` with no options (short ListOps generated if missing, a small CAST model);
# --overwrite: running this script again replaces the run it made before.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The CPU path alone where there is no GPU (the test command builds and checks the CUDA sources).
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
  scripts/build.sh cast
else
  scripts/build.sh -DCAST_ENABLE_CUDA=OFF cast
fi
./build/cast info
./build/cast train --overwrite
