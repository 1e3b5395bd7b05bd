#!/usr/bin/env bash
# Installs PyTorch (and, when it builds, the fast-transformers library) into bench/.venv for
# bench/pytorch_compare.py. Optional: only the comparison needs it, never the build or the tests.
#   bench/setup_torch.sh            PyTorch only
#   bench/setup_torch.sh --fast-transformers   also pytorch-fast-transformers (builds C++ sources)
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet torch numpy
if [ "${1:-}" = "--fast-transformers" ]; then
  # Its setup.py compiles the CPU extensions against the installed torch, and the CUDA ones
  # whenever `nvcc` is on PATH. Without a GPU those are useless (and fail with CUDA 13), so nvcc
  # is hidden from it then.
  path="$PATH"
  if ! command -v nvidia-smi > /dev/null 2>&1; then  # drop every PATH folder that holds an nvcc
    path="$(echo "$PATH" | tr ':' '\n' | while read -r dir; do [ -e "$dir/nvcc" ] || echo "$dir"; done | paste -sd: -)"
  fi
  PATH="$path" .venv/bin/pip install --quiet --no-build-isolation pytorch-fast-transformers
fi
.venv/bin/python -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads())"
