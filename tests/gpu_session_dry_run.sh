#!/usr/bin/env bash
# ctest: bench/gpu_session.sh --dry-run goes through every stage and every call of the GPU
# session on the CPU and the emulated device, ends well, writes at most 8 files, and its
# summary.md reports each stage as ok. An interface change that would break the GPU session
# (a flag renamed, a test filter that matches nothing) fails here.
#   tests/gpu_session_dry_run.sh BUILD_DIR
set -euo pipefail
build="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if ! "$(dirname "$0")/../bench/gpu_session.sh" --dry-run --out "$out" --build-dir "$build" > "$out.log" 2>&1; then
  cat "$out.log"; rm -f "$out.log"
  echo "FAIL: the dry run of bench/gpu_session.sh failed"; exit 1
fi
rm -f "$out.log"
files=$(ls "$out" | wc -l)
[ "$files" -le 8 ] || { echo "FAIL: $files files written, the device brings back 8"; ls "$out"; exit 1; }
for stage in probe kit build tests sanitizer bench tensor_core pytorch parity train; do
  grep -qE "^\| $stage \| ok \|" "$out/summary.md" || { echo "FAIL: stage $stage is not ok"; cat "$out/summary.md"; exit 1; }
done
for f in summary.md build.log tests.log sanitizer.log bench.jsonl pytorch.txt metrics.jsonl curves.svg; do
  [ -s "$out/$f" ] || { echo "FAIL: $f is missing or empty"; ls -la "$out"; exit 1; }
done
grep -q "passed, 0 failed" "$out/summary.md" || { echo "FAIL: the GPU tests did not all pass"; cat "$out/summary.md"; exit 1; }
echo "gpu_session dry run: every stage ok, $files files"
