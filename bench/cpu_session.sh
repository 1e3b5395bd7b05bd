#!/usr/bin/env bash
# The CPU measurements of bench/RESULTS.md in one run, on an otherwise idle machine:
# the attention layers at N 1024/4096/16384, the default training step, the side-by-side
# comparison with PyTorch (and fast-transformers where installed), the default `cast train`
# idle and beside one busy process, the sgemm peak, and each layer's floor (bench/cpu_floor.py).
#   bench/cpu_session.sh [path/to/cast]     (needs bench/setup_torch.sh for the comparison)
set -uo pipefail
cd "$(dirname "$0")/.."
cast="$(realpath "${1:-build/cast}")"
echo "== machine"; "$cast" info; uptime
echo "== sgemm peak (OpenBLAS via cast bench gemm)"; "$cast" bench gemm
echo "== attention layers"
"$cast" bench attention --lengths 1024,4096 --repeats 3 --warmup 1
"$cast" bench attention --lengths 16384 --repeats 2 --warmup 1
echo "== CAST at fixed C and kappa (the paper's O(alpha N) setting)"
"$cast" bench attention --lengths 1024,4096,16384 --mechanisms cast-topk --clusters 64 --cluster-size 64 --repeats 2 --warmup 1
echo "== the floor of a layer on this CPU, beside the measured time"
python3 bench/cpu_floor.py --cast "$cast" --threads "$(nproc)"
echo "== training steps"
"$cast" bench train --task listops-short --mechanisms full,cast-topk,cast-satopk,clustered,iclustered --repeats 20
"$cast" bench train --task text --length 1024 --batch-size 4 --mechanisms full,cast-topk --repeats 3 --warmup 1
if [ -x bench/.venv/bin/python ]; then
  echo "== against PyTorch"
  ft=""
  bench/.venv/bin/python -c "import fast_transformers" 2> /dev/null && ft="--fast-transformers"
  bench/.venv/bin/python bench/pytorch_compare.py --cast "$cast" --threads "$(nproc)" --rounds 3 $ft
fi
echo "== cast train, default, idle"
run=$(mktemp -d)
( cd "$run" && /usr/bin/time -f "wall %e s" "$cast" train 2>&1 | tail -4 )
echo "== cast train, default, beside one busy process"
yes > /dev/null & busy=$!
( cd "$run" && rm -rf runs && /usr/bin/time -f "wall %e s" "$cast" train 2>&1 | tail -4 )
kill "$busy"
rm -rf "$run"
