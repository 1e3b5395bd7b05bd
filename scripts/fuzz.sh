#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (AddressSanitizer and UBSan on) into
# build-fuzz/ and runs each for a bounded time from a seed it writes itself. A crash, a
# sanitizer report, a timeout or running out of the memory cap fails the script and leaves the
# input in build-fuzz/findings/.
#   scripts/fuzz.sh [seconds per target]     (default 10; CI runs the default)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
targets=(safetensors checkpoint config listops imdb aan cifar pathfinder_metadata pathfinder_png fashion_mnist)
echo "fuzz: building ${#targets[@]} targets with clang (log in build-fuzz.log)"
# -O1, as libFuzzer's documentation builds: under the sanitizers -O3 doubles the compile time.
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_COMPILER=clang++ -DCAST_FUZZ=ON \
  -DCAST_ENABLE_CUDA=OFF -DCAST_ENABLE_EMULATION=OFF > build-fuzz.log 2>&1 || { tail -n 40 build-fuzz.log; exit 1; }
cmake --build build-fuzz -j"$(nproc)" $(printf -- "--target fuzz_%s " "${targets[@]}") >> build-fuzz.log 2>&1 ||
  { tail -n 40 build-fuzz.log; exit 1; }
mkdir -p build-fuzz/findings
# the targets write their valid layouts under the temporary folder: one here, emptied each run
export TMPDIR="$PWD/build-fuzz/tmp"
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
# one target per core at a time: each is one process, and the run takes seconds × targets / cores
fuzz_one() {
  local t=$1 corpus="build-fuzz/corpus/$1"
  mkdir -p "$corpus"
  "build-fuzz/fuzz_$t" --write-seeds "$corpus" > /dev/null 2>&1
  if "build-fuzz/fuzz_$t" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=200000 \
       -artifact_prefix="build-fuzz/findings/${t}_" -print_final_stats=1 > "build-fuzz/$t.log" 2>&1; then
    echo "fuzz: $t: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "build-fuzz/$t.log" | grep -o '[0-9]*$') inputs in ${seconds} s, no finding"
  else
    echo "fuzz: $t: FAILED (build-fuzz/$t.log, input in build-fuzz/findings/)"
    grep -E "ERROR|runtime error|SUMMARY|terminate|what\(\)" "build-fuzz/$t.log" | head -5 || true
    return 1
  fi
}
status=0
pids=()
for t in "${targets[@]}"; do
  fuzz_one "$t" > "build-fuzz/$t.summary" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
for t in "${targets[@]}"; do cat "build-fuzz/$t.summary"; done
exit $status
