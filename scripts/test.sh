#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, runs every test (the CPU
# suite, the CUDA-vs-CPU tests on the CUDA emulation, everything again under ASan and UBSan, the
# GPU session's dry run and the ptxas gate), then a short fuzzing run of every file reader.
#   scripts/test.sh            everything (what CI runs)
#   scripts/test.sh --quick    a developer's loop after a change: builds what changed, runs the
#                              CPU suite and the CUDA-vs-CPU tests on the emulated device; no
#                              sanitized rerun of the CPU suite, no dry run, no ptxas gate, no
#                              hostile-files script (scripts/hostile_files.sh), no fuzzing
#                              (the packages must be installed: scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
jobs="$(nproc)"
if [ $quick = 1 ]; then
  [ -f build/CMakeCache.txt ] || scripts/build.sh -DCAST_ENABLE_CUDA=ON -DCAST_CUDA_ARCHITECTURES=80
  cmake --build build -j"$jobs" --target cast cast_tests cast_emu_tests 2>&1 | grep -E "error|warning|Linking" || true
  cmake --build build -j"$jobs" --target cast cast_tests cast_emu_tests > /dev/null  # fails here on an error
  # The CPU suite, then the emulated binary's own tests: the CUDA-vs-CPU tests, the fast-path
  # table on the emulated device, the trainer's device step, the emulator's self-tests.
  ctest --test-dir build --output-on-failure -j"$jobs" -E '^emulated\.|^gpu_session_dry_run$|^gpu_session_lra_dry_run$|^kernel_report_gate$|^cli\.hostile_files$'
  ctest --test-dir build --output-on-failure -j"$jobs" \
    -R '^emulated\.(CudaVsCpu|AllMechanisms/CudaTrainingSteps|Registry/FastPathAgainstReference|Emulation)'
  exit 0
fi
scripts/setup.sh
# Each CUDA architecture compiled once: sm_80 here, sm_90 by the ptxas gate (kernel_report_gate).
# No GPU runs this build; scripts/build.sh alone builds both into the binary.
scripts/build.sh -DCAST_ENABLE_CUDA=ON -DCAST_CUDA_ARCHITECTURES=80
ctest --test-dir build --output-on-failure -j"$jobs"
# every reader of untrusted files under libFuzzer, 10 s per target (scripts/fuzz.sh)
scripts/fuzz.sh 10
