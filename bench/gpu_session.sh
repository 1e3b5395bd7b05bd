#!/usr/bin/env bash
# One command for a session that has a GPU: build for sm_90, run every test (the CUDA ones
# included), then the attention and training benchmarks. Writes logs under ${OUT:-bench/out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/out}"
mkdir -p "$out"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/build.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >> "$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
./build-gpu/cast info | tee "$out/info.txt"
(cd build-gpu && ctest --output-on-failure -j4 2>&1) | tee "$out/tests.log" | tail -n 30
./build-gpu/cast bench attention --device cuda --json "$out/attention.jsonl" 2>&1 | tee "$out/attention.txt"
./build-gpu/cast bench attention --device cuda --tf32 2>&1 | tee "$out/attention_tf32.txt"
./build-gpu/cast bench train --task text --length 4096 --batch-size 32 --device cuda --repeats 10 2>&1 | tee "$out/train.txt"
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/pytorch_compare.py attention 2>&1 | tee "$out/pytorch_attention.txt"
  python3 bench/pytorch_compare.py train --length 4096 --train-batch 32 2>&1 | tee "$out/pytorch_train.txt"
else
  echo "PyTorch is not installed here: no comparison" | tee "$out/pytorch_attention.txt"
fi
