#!/usr/bin/env bash
# The one command for a GPU machine (no network, about 10 minutes a command): probes the
# machine, builds for sm_90 without the emulation, runs the GPU tests plainly and then a subset
# under compute-sanitizer, benchmarks attention and the Text-preset training step, compares
# with the machine's PyTorch, and trains a real task for a few hundred steps. Each stage has its
# own time budget and the session goes on after a stage fails. It writes at most 8 files into
# the output folder, among them summary.md: what each stage did, in how long, and what failed.
#
#   bench/gpu_session.sh [--out DIR] [--budget SECONDS] [--stages LIST] [--sweep-tiles]   # on the GPU machine ($OUT or bench/out)
#   bench/gpu_session.sh --dry-run [--out DIR] [--build-dir build]   # anywhere: every stage and call, tiny
#   bench/gpu_session.sh --lra NAME [--precision P] [--out DIR] [--stages LIST]   # one named LRA run (below)
#
# Dependencies without network: run bench/gpu_kit.sh beforehand where apt works; it fetches the
# Debian packages of the libraries into kit/debs, and this script unpacks them into kit/root and
# builds against that prefix (docs/engine.md, "A GPU machine without network").
#
# --stages: a comma-separated subset of probe,kit,build,tests,sanitizer,bench,tensor_core,paper,
# profile,pytorch,parity,train (default: all); probe, kit and build run whatever the list.
# paper: the LRA paper's speed and memory table (bench/paper_table.py): steps per second and
# peak memory of the Text-preset step at N 1K-4K, our four mechanisms and PyTorch's Transformer
# with N x N ("math") attention and with SDPA, at every precision; its rows go into bench.jsonl
# (`python3 bench/paper_table.py --rows bench.jsonl --figure F.svg` draws them), its tables into
# summary.md.
# tensor_core: the flash kernels' TFLOPS per kind of product (`cast bench flash`, with each
# kernel's error against f64; at the default tiles, or at every tile shape with --sweep-tiles;
# the tensor-core backward split, fused and fused-atomic), the Text-preset step at every precision for every
# mechanism (at tf32 and bf16 with fused-atomic too, and at bf16 with --recompute),
# PyTorch's at the same precisions, and the SASS's tensor-core instructions. parity: the default
# task trained at fp32 and bf16 from three seeds each (`cast compare`).
#
# --lra NAME: one named LRA run in the call (stages probe, kit, build, lra), after the stages of
# --stages where it is given (one build for both; the run then brings back runs.tar.gz, which
# holds its results files, and clusters.svg, so that the other stages' files fit the 8).
# NAME is CONFIG-MECHANISM[+MECHANISM...][-sSEEDS]: the settings file bench/lra/CONFIG.json (its
# "task" and what differs from the task's preset), the mechanisms (full, cast, clustered,
# iclustered; several joined by +, trained one after another) and the seeds (default 1), e.g.
# listops-cast, fashion-mnist-lra-10ep-full+cast, fashion-d128-clustered-s1,2,3.
# It generates the task's data on the machine (ListOps: the release's 96 000 / 2000 / 2000;
# Pathfinder-32: 200 000 images) or reads Fashion-MNIST from kit/datasets (bench/gpu_kit.sh),
# trains with `cast compare` at --precision (default tf32) until done or until the call's time
# is nearly spent (then SIGINT: each run saves its checkpoint, and `cast eval` tests it), and
# brings back only the comparison's results.md, results.json and comparison.svg (the curves),
# runs.tar.gz (each run's metrics.jsonl, summary.json and curves.svg, no checkpoints) and, for
# CAST on an image task, clusters.svg (`cast clusters`), beside summary.md and build.log.
#
# --dry-run runs every stage with the same calls on the CPU and the emulated CUDA device
# (build/cast_emu, build/cast_emu_tests from the test build) at tiny sizes: the configure step
# is the real one into a scratch folder, the compile is the test build's (already done), and
# compute-sanitizer's place is taken by the emulation's own race, barrier and bounds checks
# under AddressSanitizer. The README's test command runs it, so an interface change that would
# break this script fails there. It exits 1 when any stage fails.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
# a tensor-core backward the engine does not run by default (cuda/attention/full_attention_flash.h),
# timed beside it in the tensor_core's Text steps (the in-turn fused kernel measured 1.6-3.6x
# slower than split on an H100; the flash table times all three)
other_backward=fused-atomic
dry=0 out="${OUT:-bench/out}" budget=570 dry_build=build stages="probe,kit,build,tests,sanitizer,bench,tensor_core,paper,profile,pytorch,parity,train"
lra="" lra_precision=tf32 stages_given=0 sweep_tiles=0 lra_with_stages=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --build-dir) dry_build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --stages) stages="$2"; stages_given=1; shift 2 ;;
    --lra) lra="$2"; shift 2 ;;
    --precision) lra_precision="$2"; shift 2 ;;
    --sweep-tiles) sweep_tiles=1; shift ;;
    *) echo "gpu_session: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ -n "$lra" ]; then
  lra_with_stages=$stages_given
  mech="full|cast|clustered|iclustered"
  [[ "$lra" =~ ^([a-z0-9-]+)-(($mech)(\+($mech))*)(-s([0-9]+(,[0-9]+)*))?$ ]] ||
    { echo "gpu_session: --lra '$lra' is not CONFIG-MECHANISM[+MECHANISM...][-sSEEDS] (e.g. listops-cast, fashion-mnist-lra-10ep-full+cast, fashion-d128-full-s1,2,3)" >&2; exit 2; }
  lra_config="bench/lra/${BASH_REMATCH[1]}.json" lra_mechanism="${BASH_REMATCH[2]//+/,}" lra_seeds="${BASH_REMATCH[7]:-1}"
  [ -f "$lra_config" ] || { echo "gpu_session: --lra '$lra': no settings file $lra_config (those there: $(cd bench/lra && ls | sed 's/\.json$//' | tr '\n' ' '))" >&2; exit 2; }
  if [ $stages_given = 1 ]; then stages="$stages,lra"; else stages="probe,kit,build,lra"; fi
fi
[[ "$lra_precision" =~ ^(fp32|tf32|bf16)$ ]] || { echo "gpu_session: --precision '$lra_precision' is not fp32, tf32 or bf16" >&2; exit 2; }
# The files the chosen stages write, counted before any device time is spent: the device brings
# back 8 at most.
wanted() { [[ ",$stages," == *",$1,"* ]]; }
expected_files() {
  local n=2  # summary.md, build.log
  wanted tests && n=$((n + 1))
  wanted sanitizer && n=$((n + 1))
  { wanted bench || wanted tensor_core || wanted paper; } && n=$((n + 1))  # bench.jsonl
  { wanted pytorch || wanted tensor_core; } && n=$((n + 1))               # pytorch.txt
  wanted train && n=$((n + 2))                                             # metrics.jsonl, curves.svg
  if wanted lra; then
    n=$((n + 2))                                                     # runs.tar.gz, clusters.svg
    [ "$lra_with_stages" = 0 ] && n=$((n + 3))                       # results.md, .json, comparison.svg
  fi
  echo "$n"
}
[ "$(expected_files)" -le 8 ] ||
  { echo "gpu_session: these stages write $(expected_files) files, more than the 8 the device brings back: run fewer in one call" >&2; exit 2; }
mkdir -p "$out" || { echo "gpu_session: cannot create the output folder $out" >&2; exit 1; }
out="$(cd "$out" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
start=$(date +%s)
deadline=$((start + budget))

# The 8 files this session may write into $out (the device tool brings back at most 8); with
# --lra, summary.md, build.log and the run's five.
SUMMARY="$out/summary.md" BUILD_LOG="$out/build.log" TESTS_LOG="$out/tests.log" SAN_LOG="$out/sanitizer.log"
BENCH="$out/bench.jsonl" TORCH="$out/pytorch.txt" METRICS="$out/metrics.jsonl" CURVES="$out/curves.svg"
LRA_MD="$out/results.md" LRA_JSON="$out/results.json" LRA_FIGURE="$out/comparison.svg" LRA_RUNS="$out/runs.tar.gz"
LRA_CLUSTERS="$out/clusters.svg"
for f in "$SUMMARY" "$BUILD_LOG" "$TESTS_LOG" "$SAN_LOG" "$BENCH" "$TORCH" "$METRICS" "$CURVES" \
         "$LRA_MD" "$LRA_JSON" "$LRA_FIGURE" "$LRA_RUNS" "$LRA_CLUSTERS"; do rm -f "$f"; done

# ---------------------------------------------------------------- what each mode runs
# The GPU tests: every CUDA-vs-CPU test and the trainer's own step on the device.
GPU_FILTER='CudaVsCpu*:*CudaTrainingSteps.*:*FastPath*:Emulation.*'
# Under compute-sanitizer (each tool slows kernels 10-100x): memcheck on the attention kernels
# and one whole CAST step, racecheck and synccheck on the kernels with shared memory and barriers.
MEMCHECK_FILTER='CudaVsCpuTensorCore.FlashKernelsMatchTheF64Reference:CudaVsCpuAttention.FlashAttention:CudaVsCpuAttention.IntraClusterAttentionFused:CudaVsCpuAttention.ImprovedClusteredTopKeysFused:CudaVsCpuAttention.SummariesFused:*CudaTrainingSteps.OneStepEqualsTheCpuStep/cast'
RACE_FILTER='CudaVsCpuAttention.FlashAttention:CudaVsCpuAttention.ImprovedClusteredTopKeysFused:CudaVsCpuAttention.ClusteringSelectsTheSameMembers:CudaVsCpuTensorCore.FlashKernelsMatchTheF64Reference:CudaVsCpuTensorCore.CpAsyncCopiesOrZeroFills'
REAL_FILTERS="$GPU_FILTER $MEMCHECK_FILTER $RACE_FILTER"
if [ $dry = 1 ]; then
  build_dir="$dry_build" cast="$dry_build/cast_emu" tests="$dry_build/cast_emu_tests"
  lengths=64 text_length=8 text_batch=1 repeats=1 warmup=0 steps=2 train_batch=2 rounds=1 eval_limit=4
  train_mechanisms=full profile_mechanisms=full profile_precisions=bf16 flash_lengths=64 flash_widths=32 flash_tokens=128 flash_check=24 flash_rows=0 flash_warp=0 precisions=bf16
  split_tile_length=64 split_tile_widths=32
  parity_steps=2 parity_seeds=1 data_count=200 paper_lengths=8 paper_batch=1 paper_mechanisms=cast-topk
  # An LRA run shrunk to a few tiny steps on a few tokens (images in 4 x 4 patches), on data
  # made as small: the same calls as the real run.
  lra_tiny="--steps 2 --batch 2 --eval-limit 4 --eval-every 1 --checkpoint-every 1 --layers 1 --dim 16 --heads 2 --mlp-dim 16"
  lra_listops_data="--count 40" lra_pathfinder_count=40 lra_reserve=5
  # The emulated kernels run thousands of times slower, on a machine the other tests share: a
  # small subset of each filter runs (the real filters are checked to match tests, in the tests
  # stage), the training-step benchmark times full attention alone, and every budget is five
  # times longer.
  GPU_FILTER='CudaVsCpu.Matmul:CudaVsCpuAttention.FlashAttention:Emulation.HostPointerArgumentIsRefused'
  MEMCHECK_FILTER='*CudaTrainingSteps.OneStepEqualsTheCpuStep/cast'
  RACE_FILTER='CudaVsCpuAttention.ImprovedClusteredTopKeysFused'
  [ "$budget" = 570 ] && budget=2400
  budget_scale=5
  deadline=$((start + budget))
  sanitizer() { shift 2; "$@"; }  # the emulation's checks stand in for compute-sanitizer's
else
  budget_scale=1
  build_dir=build-gpu cast="build-gpu/cast" tests="build-gpu/cast_tests"
  lengths=1024,4096 text_length=4096 text_batch=32 repeats=5 warmup=2 steps=300 train_batch=32 rounds=3 eval_limit=0
  train_mechanisms=full,cast-topk,clustered,iclustered profile_mechanisms=full,cast-topk profile_precisions=bf16
  flash_lengths=1024,4096,16384 flash_widths=32,64,128
  flash_tokens=65536 flash_check=1024 flash_rows=0 flash_warp=0 precisions=fp32,tf32,bf16 parity_steps=1200 parity_seeds=1,2,3
  [ $sweep_tiles = 1 ] && flash_rows=32,64 flash_warp=16,32  # every tile shape, not only the defaults
  split_tile_length=4096 split_tile_widths=32,64
  paper_lengths=1024,2048,3072,4096 paper_batch=32 paper_mechanisms=full,cast-topk,clustered,iclustered
  data_count=0  # cast data's default
  lra_tiny="" lra_listops_data="" lra_pathfinder_count=200000 lra_reserve=60
  sanitizer() { compute-sanitizer --tool "$2" --error-exitcode 1 "${@:3}"; }
fi

# ---------------------------------------------------------------- stages
rows=()    # summary rows: stage | status | seconds | note
failed=0
note=""    # what a stage's command leaves for its summary row

# run_stage NAME BUDGET FUNCTION: runs FUNCTION in a subshell under the smaller of its budget
# and the session's time left; its output goes to the log the function names.
run_stage() {
  local name="$1" want=$(($2 * budget_scale)) fn="$3" left t0 rc status
  left=$((deadline - $(date +%s)))
  [ "$want" -lt "$left" ] || want="$left"
  if [ "$want" -le 5 ]; then
    rows+=("| $name | skipped | 0 | the session's time was spent |")
    failed=1
    return
  fi
  t0=$(date +%s)
  export stage_deadline=$((t0 + want))  # a stage that must stop itself in time (lra) reads it
  echo "== $name (budget ${want} s)" >&2
  note="$scratch/$name.note"
  : > "$note"
  export note
  timeout --kill-after=10 "$want" bash -c "$fn"
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="TIMEOUT after ${want} s"; failed=1 ;;
    *) status="FAILED (exit $rc)"; failed=1 ;;
  esac
  rows+=("| $name | $status | $(( $(date +%s) - t0 )) | $(tr '\n' ' ' < "$note" | sed 's/|/\\|/g') |")
}

probe() {
  {
    echo "## probe"
    date -u
    uname -srm
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: none"
    for tool in nvcc cmake ninja g++ python3 compute-sanitizer; do
      printf '%-18s ' "$tool"; { command -v "$tool" > /dev/null && "$tool" --version 2>&1 | grep -m1 -iE "version|release|[0-9]+\.[0-9]+"; } || echo "not found"
    done
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -1
    for header in fmt/core.h nlohmann/json.hpp gtest/gtest.h png.h zlib.h cblas.h; do
      where="missing"
      for dir in /usr/include /usr/local/include /usr/include/x86_64-linux-gnu/openblas-openmp kit/root/usr/include \
                 kit/root/usr/include/x86_64-linux-gnu/openblas-openmp; do
        [ -e "$dir/$header" ] && { where="$dir"; break; }
      done
      printf '%-18s %s\n' "$header" "$where"
    done
    [ -d kit/debs ] && echo "kit: $(ls kit/debs/*.deb 2>/dev/null | wc -l) packages in kit/debs" || echo "kit: none (kit/debs absent)"
  } >> "$BUILD_LOG" 2>&1
  echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)" \
       "$(grep -c missing "$BUILD_LOG") headers missing outside the kit" > "$note"
}

kit() {
  if [ ! -d kit/debs ]; then echo "no kit/debs: building against the system's packages" > "$note"; return 0; fi
  [ -d kit/root/usr ] || python3 bench/unpack_debs.py kit/root kit/debs/*.deb >> "$BUILD_LOG" 2>&1 || return 1
  echo "kit/debs unpacked into kit/root" > "$note"
}

build() {
  local prefix=() generator=()
  [ -d kit/root/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$root/kit/root/usr")
  command -v ninja > /dev/null && generator=(-G Ninja)
  local configure=(cmake -S . -DCMAKE_BUILD_TYPE=Release -DCAST_ENABLE_EMULATION=OFF -DCMAKE_CUDA_ARCHITECTURES=90
                   "${generator[@]}" "${prefix[@]}")
  echo "## build" >> "$BUILD_LOG"
  if [ $dry = 1 ]; then  # the real configure into a scratch folder, then the test build's binaries
    "${configure[@]}" -B "$scratch/configure" >> "$BUILD_LOG" 2>&1 || return 1
    cmake --build "$build_dir" --target cast_emu cast_emu_tests >> "$BUILD_LOG" 2>&1 || return 1
  else
    "${configure[@]}" -B "$build_dir" >> "$BUILD_LOG" 2>&1 || return 1
    cmake --build "$build_dir" -j"$(nproc)" >> "$BUILD_LOG" 2>&1 || { tail -n 30 "$BUILD_LOG" >&2; return 1; }
  fi
  "$cast" info >> "$BUILD_LOG" 2>&1 || return 1
  grep -m1 "cuda:" "$BUILD_LOG" | tail -1 > "$note"
}

# gtest's counts in one line: "N passed, M failed, K skipped"
test_counts() {
  local passed failed skipped
  passed=$(grep -c "^\[       OK \]" "$1"); failed=$(grep -c "^\[  FAILED  \] [A-Za-z]" "$1"); skipped=$(grep -c "^\[  SKIPPED \]" "$1")
  echo "$passed passed, $((failed / 2)) failed, $skipped skipped"  # gtest lists each failure twice
}

tests_stage() {
  local filter
  if [ $dry = 1 ]; then  # every pattern of the real session's filters must match a test
    set -f  # the filters' '*' are gtest's, not the shell's
    for filter in $(echo "$REAL_FILTERS" | tr ':' ' '); do
      [ "$filter" = "Emulation.*" ] && continue  # the emulated build's own tests: none on a GPU build
      # the listing read whole first: grep -q leaving early could end the lister by SIGPIPE
      local listed
      listed=$("$tests" --gtest_list_tests --gtest_filter="$filter")
      grep -q "^  " <<< "$listed" || { echo "the pattern $filter matches no test" >> "$note"; return 1; }
    done
  fi
  "$tests" --gtest_filter="$GPU_FILTER" > "$TESTS_LOG" 2>&1
  local rc=$?
  echo "$(test_counts "$TESTS_LOG") ($GPU_FILTER)" > "$note"
  grep -q "^\[       OK \]" "$TESTS_LOG" || { echo "no test ran" >> "$note"; return 1; }
  return $rc
}

sanitizer_stage() {
  local rc=0 tool filter
  for tool in memcheck racecheck synccheck; do
    filter="$RACE_FILTER"; [ $tool = memcheck ] && filter="$MEMCHECK_FILTER"
    echo "## $tool: $filter" >> "$SAN_LOG"
    sanitizer --tool $tool "$tests" --gtest_filter="$filter" > "$scratch/$tool.log" 2>&1 || rc=1
    cat "$scratch/$tool.log" >> "$SAN_LOG"
    echo "$tool: $(test_counts "$scratch/$tool.log" | cut -d, -f1-2);" >> "$note"
    grep -q "^\[       OK \]" "$scratch/$tool.log" || { echo "($tool ran no test)" >> "$note"; rc=1; }
  done
  return $rc
}

bench_stage() {
  "$cast" bench attention --device cuda --lengths "$lengths" --mechanisms full,cast-topk,cast-satopk,clustered,iclustered \
    --warmup "$warmup" --repeats "$repeats" --json "$scratch/attention.jsonl" > "$scratch/attention.txt" 2>&1 || { cat "$scratch/attention.txt" >&2; return 1; }
  cp "$scratch/attention.jsonl" "$BENCH"  # kept when the training-step benchmark fails
  "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda \
    --mechanisms "$train_mechanisms" --warmup "$warmup" --repeats "$repeats" --json "$scratch/train.jsonl" > "$scratch/train.txt" 2>&1 || { cat "$scratch/train.txt" >&2; return 1; }
  cat "$scratch/attention.jsonl" "$scratch/train.jsonl" > "$BENCH"  # kept when the recompute rows fail
  # the same step with every block recomputed in its backward (--recompute): its memory and time
  "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --recompute \
    --mechanisms "$train_mechanisms" --warmup "$warmup" --repeats "$repeats" --json "$scratch/recompute.jsonl" > "$scratch/recompute.txt" 2>&1 || { cat "$scratch/recompute.txt" >&2; return 1; }
  cat "$scratch/attention.jsonl" "$scratch/train.jsonl" "$scratch/recompute.jsonl" > "$BENCH"
  cat "$scratch/attention.txt" "$scratch/train.txt" "$scratch/recompute.txt" > "$scratch/bench.txt"
  echo "$(wc -l < "$BENCH") results in bench.jsonl" > "$note"
  [ -s "$BENCH" ]
}

# Kernel times of one training step per profiled mechanism and precision (Nsight Compute, one metric, one pass), summed
# by kernel with bench/kernel_times.py, to set against bench/floor.py's table.
profile_stage() {
  if [ $dry = 1 ] || ! command -v ncu > /dev/null; then
    python3 bench/kernel_times.py --help > /dev/null || return 1
    echo "no ncu$([ $dry = 1 ] && echo " in the dry run"): kernel times skipped" > "$note"
    return 0
  fi
  local mechanism p
  for p in ${profile_precisions//,/ }; do
    for mechanism in ${profile_mechanisms//,/ }; do
      ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision "$p" \
        --mechanisms "$mechanism" --warmup 0 --repeats 1 > "$scratch/ncu.csv" 2> "$scratch/ncu.err" || { tail -n 5 "$scratch/ncu.err" >&2; return 1; }
      { echo "== $mechanism at $p: one Text-preset step, N $text_length, batch $text_batch"
        python3 bench/kernel_times.py "$scratch/ncu.csv" --top 20; } >> "$scratch/profile.txt" || return 1
    done
  done
  grep -h "launches," "$scratch/profile.txt" | tr '\n' ';' > "$note"
}

pytorch_stage() {
  local args=(--device cuda --cast "$cast" --rounds "$rounds" --repeats "$repeats" --lengths "$lengths"
              --work layer,cast-layer,text-step --text-length "$text_length" --text-batch "$text_batch")
  [ $dry = 1 ] && args+=(--dry-run)
  python3 bench/pytorch_compare.py "${args[@]}" > "$TORCH" 2>&1 || { tail -n 20 "$TORCH" >&2; return 1; }
  tail -n 1 "$TORCH" > "$note"
}

train_stage() {
  local run="$scratch/run"
  "$cast" data --task listops-short --count "$data_count" --out "$scratch/listops-short" > "$scratch/train_run.txt" 2>&1 || { cat "$scratch/train_run.txt" >&2; return 1; }
  "$cast" train --task listops-short --attention cast --device cuda --steps "$steps" --batch "$train_batch" \
    --log-every 25 --eval-limit "$eval_limit" --data "$scratch/listops-short" --run "$run" >> "$scratch/train_run.txt" 2>&1 || { tail -n 20 "$scratch/train_run.txt" >&2; return 1; }
  cp "$run/metrics.jsonl" "$METRICS" && cp "$run/curves.svg" "$CURVES" || return 1
  grep -E "done in|test accuracy" "$scratch/train_run.txt" | tr -s ' ' > "$note"
}

# The tensor cores: each flash kernel's rate and error, the SASS's tensor-core instructions, the
# Text-preset step at every precision, and PyTorch's at the same precisions.
tensor_core_stage() {
  local p tc="$scratch/tensor_core.txt"
  if command -v cuobjdump > /dev/null; then
    { echo "## SASS of the flash kernels: tensor-core and async-copy instructions"
      cuobjdump -sass "$cast" | awk '/Function : .*flash_tc_/{k=$3} k && /HMMA|LDSM|LDGSTS/{match($0,/(HMMA|LDSM|LDGSTS)[.A-Z0-9]*/); n[k" "substr($0,RSTART,RLENGTH)]++} END{for (i in n) print n[i], i}' | sort -k2 | head -n 60
    } >> "$BUILD_LOG" 2>&1
  fi
  # where the bf16 kernels' time goes at N 4096, head width 64: ncu's throughput, occupancy and
  # warp-stall sections for one forward, dQ and dK/dV launch (into build.log)
  if [ $dry = 0 ] && command -v ncu > /dev/null; then
    { echo "## ncu: the bf16 flash kernels at N 4096, d 64 (one launch each)"
      timeout 120 ncu --clock-control none --kernel-name regex:flash_tc --launch-count 3 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
        "$cast" bench flash --device cuda --kernels bf16 --lengths 4096 --head-widths 64 --tokens 65536 \
        --check-length 0 --warmup 0 --repeats 1 2>&1 | grep -vE "^==PROF==|^\s*$|^-+$" | cut -c1-160 | head -n 400
    } >> "$BUILD_LOG" 2>&1
  fi
  "$cast" bench flash --device cuda --lengths "$flash_lengths" --head-widths "$flash_widths" --tokens "$flash_tokens" \
    --check-length "$flash_check" --stream-rows "$flash_rows" --warp-rows "$flash_warp" --flash-backward split,fused,fused-atomic \
    --warmup "$warmup" --repeats "$repeats" --json "$scratch/flash.jsonl" > "$tc" 2>&1 || { cat "$tc" >&2; return 1; }
  # every tile of the split TF32 kernel, the engine's at --precision fp32 (its pair rows fit tiles
  # its earlier operands did not), with one buffer of streamed tiles or two (its backward at width
  # 64), and either backward
  "$cast" bench flash --device cuda --kernels tf32x3 --lengths "$split_tile_length" --head-widths "$split_tile_widths" \
    --tokens "$flash_tokens" --check-length 0 --stream-rows 32,64 --warp-rows 16,32 --copy-stages 1,2 --flash-backward split,fused-atomic \
    --warmup "$warmup" --repeats "$repeats" --json "$scratch/flash-split-tiles.jsonl" >> "$tc" 2>&1 || { cat "$tc" >&2; return 1; }
  for p in ${precisions//,/ }; do
    "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision "$p" \
      --mechanisms "$train_mechanisms" --warmup "$warmup" --repeats "$repeats" --json "$scratch/train-$p.jsonl" >> "$tc" 2>&1 || { tail -n 20 "$tc" >&2; return 1; }
    # the tensor-core precisions again with the other backward ($other_backward)
    [ "$p" = fp32 ] && continue
    "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision "$p" \
      --flash-backward "$other_backward" --mechanisms "$train_mechanisms" --warmup "$warmup" --repeats "$repeats" \
      --json "$scratch/train-$p-$other_backward.jsonl" >> "$tc" 2>&1 || { tail -n 20 "$tc" >&2; return 1; }
  done
  # the bf16 step with every block recomputed in its backward (--recompute): its memory and time
  "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision bf16 --recompute \
    --mechanisms "$train_mechanisms" --warmup "$warmup" --repeats "$repeats" --json "$scratch/train-bf16-recompute.jsonl" >> "$tc" 2>&1 || { tail -n 20 "$tc" >&2; return 1; }
  # the bf16 step with cuBLAS's FAST_16BF on FP32 operands, the engine's way before its BF16 copies
  "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision bf16 \
    --bf16-gemm fast16bf --mechanisms full --warmup "$warmup" --repeats "$repeats" --json "$scratch/train-bf16-fast16bf.jsonl" >> "$tc" 2>&1 || { tail -n 20 "$tc" >&2; return 1; }
  # the bf16 step with the heads laid out by one product and a permute, as before they were
  # folded into the projections (issue 38: the per-head products against the permutes)
  "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision bf16 \
    --head-projections permuted --mechanisms full --warmup "$warmup" --repeats "$repeats" --json "$scratch/train-bf16-permuted.jsonl" >> "$tc" 2>&1 || { tail -n 20 "$tc" >&2; return 1; }
  # the fp32 step with the FMA flash kernel, the engine's choice for --precision fp32 before the split TF32 one
  "$cast" bench train --task text --length "$text_length" --batch-size "$text_batch" --device cuda --precision fp32 \
    --fp32-flash fma --mechanisms full --warmup "$warmup" --repeats "$repeats" --json "$scratch/train-fp32-fma.jsonl" >> "$tc" 2>&1 || { tail -n 20 "$tc" >&2; return 1; }
  cat "$scratch/flash.jsonl" "$scratch/flash-split-tiles.jsonl" "$scratch"/train-*.jsonl >> "$BENCH"
  local args=(--device cuda --cast "$cast" --rounds 1 --repeats "$repeats" --lengths "$flash_lengths"
              --work sdpa,text-step --text-length "$text_length" --text-batch "$text_batch")
  [ $dry = 1 ] && args+=(--dry-run)
  for p in ${precisions//,/ }; do
    python3 bench/pytorch_compare.py "${args[@]}" --precision "$p" >> "$scratch/torch_tc.txt" 2>&1 || { tail -n 20 "$scratch/torch_tc.txt" >&2; return 1; }
  done
  cat "$scratch/torch_tc.txt" >> "$TORCH"
  echo "$(grep -c . "$scratch/flash.jsonl") flash rows; steps at ${precisions}" > "$note"
}

# The LRA paper's speed and memory table at every precision: rows into bench.jsonl, tables into
# the summary, and the figure drawn from the rows (checked here; drawn again where they land).
paper_stage() {
  local p args
  for p in ${precisions//,/ }; do
    args=(--device cuda --cast "$cast" --lengths "$paper_lengths" --batch "$paper_batch" --precision "$p"
          --mechanisms "$paper_mechanisms"
          --warmup "$warmup" --repeats "$repeats" --json "$scratch/paper.jsonl")
    [ $dry = 1 ] && args+=(--dry-run)
    python3 bench/paper_table.py "${args[@]}" >> "$scratch/paper.txt" 2>&1 || { tail -n 20 "$scratch/paper.txt" >&2; return 1; }
  done
  cat "$scratch/paper.jsonl" >> "$BENCH"
  python3 bench/paper_table.py --rows "$scratch/paper.jsonl" --figure "$scratch/paper.svg" > /dev/null || return 1
  echo "$(grep -c . "$scratch/paper.jsonl") rows at ${precisions}" > "$note"
}

# Learning parity: the default task at fp32 and at bf16 from the same seeds.
parity_stage() {
  local folder="$scratch/parity"
  "$cast" data --task listops-short --count "$data_count" --out "$scratch/listops-short-parity" > "$scratch/parity.txt" 2>&1 || { cat "$scratch/parity.txt" >&2; return 1; }
  "$cast" compare --task listops-short --attention cast --vary precision=fp32,bf16 --seeds "$parity_seeds" \
    --device cuda --steps "$parity_steps" --batch "$train_batch" \
    --eval-limit "$eval_limit" --data "$scratch/listops-short-parity" --out "$folder" >> "$scratch/parity.txt" 2>&1 || { tail -n 20 "$scratch/parity.txt" >&2; return 1; }
  cat "$folder"/results*.md > "$scratch/parity.md" || return 1
  { echo; echo "Final losses (each run's last test and validation lines of metrics.jsonl):"
    for f in "$folder"/*/metrics.jsonl; do
      echo "$(basename "$(dirname "$f")") $(grep '"split":"test"' "$f" | tail -n 1) $(grep '"split":"val"' "$f" | tail -n 1)"
    done; } >> "$scratch/parity.md"
  grep -E "^\| .*(fp32|bf16)" "$scratch/parity.md" | tr -s ' ' > "$note" || true
}

# One named LRA run (--lra): its data, `cast compare` until done or until the stage's time is
# nearly spent, `cast eval` of what a stop left, and the files it brings back.
lra_stage() {
  local folder="$scratch/lra" data="$scratch/lra-data" log="$scratch/lra.txt" task tiny=() rc limit f
  task=$(sed -n 's/^ *"task": *"\([a-z0-9-]*\)".*/\1/p' "$lra_config")
  [ -n "$task" ] || { echo "$lra_config names no task" >> "$note"; return 1; }
  read -r -a tiny <<< "$lra_tiny"
  if [ $dry = 1 ]; then  # images in 4 x 4 patches, ListOps cut to 64 tokens
    [[ "$task" == fashion-mnist* || "$task" == pathfinder ]] && tiny+=(--patch 4)
    [ "$task" = listops ] && tiny+=(--max-len 64)
  fi
  case "$task" in
    listops) "$cast" data listops $lra_listops_data --out "$data" > "$log" 2>&1 || { cat "$log" >&2; return 1; } ;;
    pathfinder) "$cast" data pathfinder --count "$lra_pathfinder_count" --out "$data" > "$log" 2>&1 || { cat "$log" >&2; return 1; } ;;
    fashion-mnist*) data="$root/kit/datasets/fashion-mnist"; [ -d "$data" ] || data=/usr/share/datasets/fashion-mnist ;;
    *) echo "no data for task $task on this machine" >> "$note"; return 1 ;;
  esac
  limit=$((stage_deadline - $(date +%s) - lra_reserve))
  [ "$limit" -gt 10 ] || { echo "no time left to train after the data" >> "$note"; return 1; }
  echo "$(date -u +%T) $lra: cast compare for at most $limit s" >> "$log"
  timeout -s INT -k 30 "$limit" "$cast" compare --task "$task" --config "$lra_config" --attention "$lra_mechanism" \
    --seeds "$lra_seeds" --device cuda --precision "$lra_precision" --data "$data" --out "$folder" "${tiny[@]}" >> "$log" 2>&1
  rc=$?
  if [ $rc = 130 ] || [ $rc = 124 ]; then  # stopped by the time limit: each run's checkpoint, tested
    echo "stopped by the call's time limit (exit $rc); each run's checkpoint evaluated;" >> "$note"
    for f in "$folder"/*/checkpoint.safetensors; do
      [ -f "$f" ] || continue
      echo "== cast eval $f" >> "$log"
      "$cast" eval --checkpoint "$f" --device cuda --data "$data" >> "$log" 2>&1 || echo "(cast eval failed: exit $?)" >> "$log"
    done
  elif [ $rc != 0 ]; then
    tail -n 20 "$log" >&2
  fi
  [ -f "$folder/results.md" ] && cp "$folder/results.md" "$scratch/lra_results.md"
  if [ "$lra_with_stages" = 0 ]; then  # beside other stages' files they travel in runs.tar.gz alone
    for f in results.md results.json comparison.svg; do [ -f "$folder/$f" ] && cp "$folder/$f" "$out/$f"; done
  fi
  tar -czf "$LRA_RUNS" -C "$folder" --exclude='*.safetensors' --exclude='.cast.lock' --exclude='*.tmp' . || return 1
  if [[ ",$lra_mechanism," == *,cast,* ]] && [[ "$task" == fashion-mnist* || "$task" == pathfinder ]]; then
    f=$(ls "$folder"/cast*/checkpoint.safetensors 2>/dev/null | head -n 1)
    [ -n "$f" ] && { "$cast" clusters --checkpoint "$f" --data "$data" --out "$LRA_CLUSTERS" >> "$log" 2>&1 || return 1; }
  fi
  # each mechanism's row of the results table (its first: the table of runs follows it)
  grep -hE "^\| (${lra_mechanism//,/|}) " "$scratch/lra_results.md" 2>/dev/null | awk '!seen[$2]++' | tr -s ' ' >> "$note"
  grep -hE "test accuracy|stopped|done in" "$log" | tail -n 4 | tr -s ' ' | tr '\n' ';' >> "$note"
  [ $rc = 0 ] || [ $rc = 130 ] || [ $rc = 124 ]
}

# Each stage runs in its own bash under `timeout`: it sees these functions and settings.
export -f probe kit build test_counts tests_stage sanitizer sanitizer_stage bench_stage profile_stage pytorch_stage train_stage \
  tensor_core_stage paper_stage parity_stage lra_stage
export lra lra_with_stages lra_config lra_mechanism lra_seeds lra_precision lra_tiny lra_listops_data lra_pathfinder_count lra_reserve \
  LRA_MD LRA_JSON LRA_FIGURE LRA_RUNS LRA_CLUSTERS
export split_tile_length split_tile_widths other_backward profile_mechanisms profile_precisions flash_lengths flash_widths flash_tokens flash_check flash_rows flash_warp precisions parity_steps parity_seeds data_count \
  paper_lengths paper_batch paper_mechanisms
export REAL_FILTERS eval_limit train_mechanisms cast tests build_dir lengths text_length text_batch repeats warmup steps train_batch rounds dry out scratch root \
  GPU_FILTER MEMCHECK_FILTER RACE_FILTER SUMMARY BUILD_LOG TESTS_LOG SAN_LOG BENCH TORCH METRICS CURVES
# The kit's libraries are found at run time too (the build's RPATH names them as well).
if [ -d kit/debs ]; then
  export LD_LIBRARY_PATH="$root/kit/root/usr/lib/x86_64-linux-gnu:$root/kit/root/usr/lib/x86_64-linux-gnu/openblas-openmp:$root/kit/root/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
wanted probe && run_stage probe 20 probe
run_stage kit 40 kit
run_stage build 300 build
later=(tests:70:tests_stage tensor_core:200:tensor_core_stage paper:200:paper_stage sanitizer:100:sanitizer_stage bench:90:bench_stage
       profile:150:profile_stage pytorch:70:pytorch_stage parity:150:parity_stage train:60:train_stage lra:600:lra_stage)
for entry in "${later[@]}"; do
  IFS=: read -r name seconds fn <<< "$entry"
  wanted "$name" || continue
  if [ -x "$cast" ] && [ -x "$tests" ]; then
    run_stage "$name" "$seconds" "$fn"
  else
    rows+=("| $name | skipped | 0 | no binary: the build failed |")
    failed=1
  fi
done

# ---------------------------------------------------------------- summary.md
{
  echo "# GPU session $(date -u +%Y-%m-%dT%H:%MZ)$([ $dry = 1 ] && echo " (dry run: CPU and emulated device, tiny sizes)")"
  echo
  echo "Total $(( $(date +%s) - start )) s of a ${budget} s budget. $([ $failed = 0 ] && echo "Every stage passed." || echo "Some stage FAILED: see below and its log.")"
  echo
  echo "| stage | status | seconds | what it found |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  [ -n "$lra" ] && echo "One named LRA run: $lra ($lra_config, $lra_mechanism, seeds $lra_seeds, $lra_precision)." && echo
  for f in "$scratch/bench.txt" "$scratch/tensor_core.txt" "$scratch/paper.txt" "$scratch/parity.md" "$TORCH" "$scratch/lra_results.md"; do
    [ -s "$f" ] && { echo '```'; grep -vE "^\s*$" "$f" | tail -n 80; echo '```'; echo; }
  done
  [ -s "$scratch/profile.txt" ] && { echo '```'; cat "$scratch/profile.txt"; echo '```'; echo; }
  [ -s "$scratch/train_run.txt" ] && { echo '```'; tail -n 6 "$scratch/train_run.txt"; echo '```'; echo; }
  [ -s "$scratch/lra.txt" ] && { echo '```'; grep -vE "^\s*$" "$scratch/lra.txt" | tail -n 40; echo '```'; echo; }
  echo "Files: $(cd "$out" && ls | tr '\n' ' ')"
  for log in "$TESTS_LOG" "$SAN_LOG"; do
    [ -s "$log" ] && grep -q "FAILED\|ERROR SUMMARY: [1-9]" "$log" && { echo; echo "Failures in $(basename "$log"):"; echo '```';
      grep -E "^\[  FAILED  \]|ERROR SUMMARY: [1-9]|Failure$" "$log" | head -n 20; echo '```'; }
  done
} > "$SUMMARY"
cat "$SUMMARY"
files=$(ls "$out" | wc -l)
if [ "$files" -gt 8 ]; then echo "gpu_session: $files files in $out, more than the 8 the device brings back" >&2; failed=1; fi
exit $failed
