#!/usr/bin/env bash
# Top-ten CPU hotspots (self time, by symbol) of the default training step and of one
# Text-preset attention layer (D 256, 4 heads) at N 4096, full and CAST, with perf.
#   bench/profile.sh [path/to/cast]      (default build/cast; needs Debian's linux-perf)
set -euo pipefail
cast="$(realpath "${1:-build/cast}")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
top() {  # $1 title, rest: the cast command
  local title="$1"; shift
  perf record -q -o "$tmp/perf.data" "$cast" "$@" > /dev/null 2>&1
  echo "### $title"
  echo '```'
  perf report -i "$tmp/perf.data" --no-children --sort dso,symbol 2>/dev/null > "$tmp/report.txt" || true
  grep -E '^ +[0-9]' "$tmp/report.txt" | head -10 | sed -E 's/ +$//' | cut -c1-150 || true
  echo '```'
}
top "default training step (listops-short, CAST top-k), 30 steps" \
  bench train --task listops-short --mechanisms cast-topk --repeats 30 --warmup 2
top "full attention layer, N 4096, forward+backward" \
  bench attention --lengths 4096 --mechanisms full --repeats 3 --warmup 1
top "CAST (top-k) attention layer, N 4096, forward+backward" \
  bench attention --lengths 4096 --mechanisms cast-topk --repeats 5 --warmup 1
