#!/usr/bin/env bash
# ctest: bench/gpu_session.sh --dry-run goes through every stage and every call of the GPU
# session on the CPU and the emulated device, ends well, writes at most 8 files, and its
# summary.md reports each stage as ok. An interface change that would break the GPU session
# (a flag renamed, a test filter that matches nothing) fails here.
# With --lra, instead: each settings file of bench/lra as one named LRA run (--lra NAME).
#   tests/gpu_session_dry_run.sh BUILD_DIR [--lra]
set -euo pipefail
build="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if [ "${2:-}" != --lra ]; then
if ! "$(dirname "$0")/../bench/gpu_session.sh" --dry-run --out "$out" --build-dir "$build" > "$out.log" 2>&1; then
  cat "$out.log"; rm -f "$out.log"
  echo "FAIL: the dry run of bench/gpu_session.sh failed"; exit 1
fi
rm -f "$out.log"
files=$(ls "$out" | wc -l)
[ "$files" -le 8 ] || { echo "FAIL: $files files written, the device brings back 8"; ls "$out"; exit 1; }
for stage in probe kit build tests sanitizer bench tensor_core paper pytorch parity train; do
  grep -qE "^\| $stage \| ok \|" "$out/summary.md" || { echo "FAIL: stage $stage is not ok"; cat "$out/summary.md"; exit 1; }
done
for f in summary.md build.log tests.log sanitizer.log bench.jsonl pytorch.txt metrics.jsonl curves.svg; do
  [ -s "$out/$f" ] || { echo "FAIL: $f is missing or empty"; ls -la "$out"; exit 1; }
done
grep -q "passed, 0 failed" "$out/summary.md" || { echo "FAIL: the GPU tests did not all pass"; cat "$out/summary.md"; exit 1; }
echo "gpu_session dry run: every stage ok, $files files"
exit 0
fi

# One named LRA run per call (--lra): each settings file of bench/lra once, tiny, with what it
# brings back: the comparison's files, the runs without checkpoints, and CAST's clusters on images.
for name in listops-cast fashion-mnist-lra-cast pathfinder-full fashion-d128-clustered-s1,2; do
  rm -rf "$out" && mkdir -p "$out"
  if ! "$(dirname "$0")/../bench/gpu_session.sh" --dry-run --lra "$name" --out "$out" --build-dir "$build" > "$out.log" 2>&1; then
    cat "$out.log"; rm -f "$out.log"
    echo "FAIL: the dry run of bench/gpu_session.sh --lra $name failed"; exit 1
  fi
  rm -f "$out.log"
  grep -qE "^\| lra \| ok \|" "$out/summary.md" || { echo "FAIL: --lra $name: stage lra is not ok"; cat "$out/summary.md"; exit 1; }
  expected="build.log comparison.svg results.json results.md runs.tar.gz summary.md"
  [ "$name" = fashion-mnist-lra-cast ] && expected="build.log clusters.svg comparison.svg results.json results.md runs.tar.gz summary.md"
  [ "$(ls "$out" | tr '\n' ' ')" = "$expected " ] || { echo "FAIL: --lra $name wrote $(ls "$out" | tr '\n' ' '), not $expected"; exit 1; }
  runs=$(tar -tzf "$out/runs.tar.gz")
  seeds=$(echo "$name" | sed -n 's/.*-s\([0-9,]*\)$/\1/p')
  for seed in $(echo "${seeds:-1}" | tr ',' ' '); do
    grep -q "seed$seed/metrics.jsonl" <<< "$runs" || { echo "FAIL: --lra $name: runs.tar.gz lacks seed $seed's metrics"; exit 1; }
  done
  grep -q "/summary.json" <<< "$runs" || { echo "FAIL: --lra $name: runs.tar.gz holds no summary.json"; echo "$runs"; exit 1; }
  ! grep -q "safetensors" <<< "$runs" || { echo "FAIL: --lra $name: runs.tar.gz holds checkpoints"; exit 1; }
done
# An LRA run after other stages in one call (one build): its results travel in runs.tar.gz alone,
# beside the stages' own files.
rm -rf "$out" && mkdir -p "$out"
if ! "$(dirname "$0")/../bench/gpu_session.sh" --dry-run --stages tests --lra fashion-mnist-lra-10ep-cast --out "$out" \
     --build-dir "$build" > "$out.log" 2>&1; then
  cat "$out.log"; rm -f "$out.log"
  echo "FAIL: the dry run of bench/gpu_session.sh --stages tests --lra fashion-mnist-lra-10ep-cast failed"; exit 1
fi
rm -f "$out.log"
for stage in tests lra; do
  grep -qE "^\| $stage \| ok \|" "$out/summary.md" || { echo "FAIL: --stages tests --lra: stage $stage is not ok"; cat "$out/summary.md"; exit 1; }
done
expected="build.log clusters.svg runs.tar.gz summary.md tests.log"
[ "$(ls "$out" | tr '\n' ' ')" = "$expected " ] || { echo "FAIL: --stages tests --lra wrote $(ls "$out" | tr '\n' ' '), not $expected"; exit 1; }
# The listing is read whole first: with pipefail, grep -q leaving early would kill tar by SIGPIPE.
runs=$(tar -tzf "$out/runs.tar.gz")
grep -q "results.md" <<< "$runs" || { echo "FAIL: --stages tests --lra: runs.tar.gz lacks results.md"; exit 1; }
echo "gpu_session dry run: every LRA settings file ran, and a run beside other stages"
