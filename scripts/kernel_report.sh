#!/usr/bin/env bash
# Compiles every CUDA file for one architecture with ptxas's resource report and prints, per
# kernel, registers, shared memory and spill bytes. Needs nvcc, no GPU.
#   scripts/kernel_report.sh [arch]     (default 90)
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-90}"
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
total_spills=0
for f in cuda/*.cu; do
  "$nvcc_bin" -std=c++17 -O3 -arch=sm_"$arch" --expt-relaxed-constexpr -I. -DCAST_WITH_CUDA \
    -Xptxas -v -c "$f" -o "$tmp/k.o" 2> "$tmp/report.txt" || { cat "$tmp/report.txt"; exit 1; }
  # ptxas prints "Compiling entry function 'NAME'" then "Used N registers, ..." and a spill line
  awk -v file="$f" '
    /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); name = substr($0, RSTART + 1, RLENGTH - 2) }
    /spill stores/ { split($0, a, " "); for (i = 1; i <= length(a); i++) if (a[i] == "bytes" && a[i+1] == "spill" && a[i+2] == "stores,") stores = a[i-1] }
    /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
      printf "%-22s %-60.60s regs %3s  spill stores %s bytes\n", file, name, regs, stores }
  ' "$tmp/report.txt"
  s=$( (grep -o "[0-9]* bytes spill stores" "$tmp/report.txt" || true) | awk '{s += $1} END {print s + 0}')
  total_spills=$((total_spills + s))
done
echo "total spill-store bytes across all kernels (sm_$arch): $total_spills"
