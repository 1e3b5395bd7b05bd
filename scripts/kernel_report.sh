#!/usr/bin/env bash
# Compiles every CUDA file for one architecture with ptxas's resource report and prints, per
# kernel: registers, stack frame, spill stores and loads, shared memory per block (static, plus
# the dynamic shared memory of the flash kernels' launches) and theoretical occupancy. Needs
# nvcc, no GPU.
#
# It is also a gate: it exits 1 when a kernel on the attention path (the files in
# ATTENTION_PATH below) has a stack frame or spills, since either means per-thread arrays or
# registers gone to local memory, the slowest memory a kernel can touch. `--no-gate` only prints.
#
#   scripts/kernel_report.sh [--arch 90] [--cast build/cast] [--no-gate]
#
# Occupancy (sm_90: 64 warps, 65536 registers, 228 KiB shared memory and 32 blocks per SM):
# the fewest blocks that registers, shared memory and warps allow, times warps per block. The
# threads and dynamic shared memory of the flash kernels come from `cast info --kernels` (the
# binary given by --cast, or build/cast); every other kernel is counted at 256 threads and its
# static shared memory (marked *), which is how cuda/common.cuh launches most of them.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=90 gate=1 cast_bin=build/cast
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --cast) cast_bin="$2"; shift 2 ;;
    --no-gate) gate=0; shift ;;
    *) echo "kernel_report: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
# every file of cuda/attention/, and the softmax and top-k kernels the mechanisms call
ATTENTION_PATH="$(for f in cuda/attention/*.cu; do basename "$f" .cu; done | tr '\n' ' ')softmax topk"

nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$nvcc_bin" ] || { echo "kernel_report: nvcc not found (PATH or /usr/local/cuda/bin)" >&2; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ptxas's report for every file, the files compiled side by side: the device code alone (-cubin;
# the host side does not depend on the architecture and the build compiles it), which took 39% of
# -c's time on the small files
ls cuda/*.cu cuda/attention/*.cu | xargs -P "$(nproc)" -I{} sh -c '
  f="{}"; stem=$(basename "$f" .cu)
  "$0" -std=c++17 -O3 -arch=sm_$1 --expt-relaxed-constexpr -I. -DCAST_WITH_CUDA -Xptxas -v -cubin "$f" \
    -o "$2/$stem.cubin" > "$2/$stem.report" 2>&1 || { cat "$2/$stem.report" >&2; echo "kernel_report: $f does not compile" >&2; exit 255; }
' "$nvcc_bin" "$arch" "$tmp"

launches="$tmp/launches.txt"
if [ -x "$cast_bin" ] && "$cast_bin" info --kernels > "$launches" 2>/dev/null; then :; else : > "$launches"; fi

printf "%-20s %-44s %5s %6s %6s %6s %8s %10s\n" file kernel regs stack spillS spillL smem/blk occupancy
status=0
for report in "$tmp"/*.report; do
  stem=$(basename "$report" .report)
  # one line per entry: mangled name, registers, stack, spill stores, spill loads, static smem
  awk '
    /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); name = substr($0, RSTART + 1, RLENGTH - 2); stack = 0; st = 0; ld = 0 }
    /bytes stack frame/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "stack") stack = $i;
                          if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") st = $i;
                          if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "loads") ld = $i } }
    /Used [0-9]+ registers/ { regs = 0; smem = 0
      for (i = 1; i <= NF; i++) { if ($i == "Used") regs = $(i+1); if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i }
      print name, regs, stack, st, ld, smem }
  ' "$report" > "$tmp/$stem.entries"
  while read -r mangled regs stack st ld smem; do
    # void cast::cuda::(anonymous namespace)::flash_forward_kernel<cast::...::Tile<32, 4, 8>>(float*, ...)
    name=$(echo "$mangled" | c++filt | sed -E 's/^void //; s/\(anonymous namespace\):://g; s/cast::cuda:://g; s/cast:://g; s/ >/>/g; s/\([^()]*\)$//')
    threads=256 dynamic=0 mark="*"
    line=$(grep -F "kernel $name " "$launches" || true)
    if [ -n "$line" ]; then
      threads=$(echo "$line" | awk '{print $(NF-2)}'); dynamic=$(echo "$line" | awk '{print $NF}'); mark=""
    fi
    occupancy=$(awk -v regs="$regs" -v threads="$threads" -v shared=$((smem + dynamic)) 'BEGIN {
      warps = int((threads + 31) / 32); warp_regs = int((regs * 32 + 255) / 256) * 256
      by_regs = warp_regs > 0 ? int(65536 / (warps * warp_regs)) : 32
      by_smem = shared > 0 ? int(233472 / (shared + 1024)) : 32
      by_warps = int(64 / warps); b = by_regs; if (by_smem < b) b = by_smem; if (by_warps < b) b = by_warps; if (b > 32) b = 32
      printf "%d%% (%d warps)", 100 * b * warps / 64, b * warps }')
    printf "%-20s %-44.44s %5s %6s %6s %6s %7s%1s %10s\n" "$stem.cu" "$name" "$regs" "$stack" "$st" "$ld" \
      "$((smem + dynamic))" "$mark" "$occupancy"
    if [ "$gate" = 1 ] && [[ " $ATTENTION_PATH " == *" $stem "* ]] && { [ "$stack" != 0 ] || [ "$st" != 0 ] || [ "$ld" != 0 ]; }; then
      echo "kernel_report: GATE: $stem.cu $name has a ${stack}-byte stack frame and ${st}/${ld} bytes of spill stores/loads (attention path: no local memory)" >&2
      status=1
    fi
  done < "$tmp/$stem.entries"
done
[ -s "$launches" ] || echo "(no 'cast info --kernels' from $cast_bin: the flash kernels are counted at 256 threads without their dynamic shared memory)"
echo "* 256 threads and static shared memory assumed; sm_$arch; gate on: $ATTENTION_PATH"
exit $status
