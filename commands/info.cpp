#include "commands/commands.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "cpu/runtime.h"
#include "ops/attention/fast_paths.h"
#include "ops/ops.h"
#include "tensor/device_memory.h"
#include "train/cli.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/full_attention_flash.h"
#include "cuda/runtime.h"
#endif

namespace cast {

static std::string gib(size_t bytes) { return fmt::format("{:.1f} GiB", bytes / 1073741824.0); }

// The CPU's model name from /proc/cpuinfo ("unknown" where it cannot be read).
static std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown";
}

// The widest vector ISA this build's host code uses (what -march allowed the compiler).
static const char* build_vector_isa() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2";
#else
  return "scalar";
#endif
}

// The fast-path table (ops/attention/fast_paths.h) as Markdown, in the order the paths are tried.
// docs/engine.md shows this output; tests/test_cli.cpp checks that it still does.
static void print_fast_paths() {
  fmt::print("| step (reference) | fast path | file | supports |\n|---|---|---|---|\n");
  for (const ops::FastPath& path : ops::fast_paths())
    fmt::print("| `{}` | `{}` | `{}` | {} |\n", ops::step_name(path.step), path.name, path.file, path.supports);
}

int command_info(const std::vector<std::string>& argv) {
  cli::Args args("info", "Print the build options and the devices found.");
  args.flag("kernels",
            "list how each flash attention kernel is launched (threads, dynamic shared memory), for "
            "scripts/kernel_report.sh; needs no GPU");
  args.flag("fast-paths", "print the table of fast paths (each step's fused kernels) as Markdown");
  args.example("cast info");
  args.example("cast info --fast-paths");
  args.example("cast info --kernels");
  if (!args.parse(argv)) return 0;
  CAST_CHECK_USAGE(!(args.is_set("fast-paths") && args.is_set("kernels")),
                   "--fast-paths and --kernels print different tables; give one of them");
  if (args.is_set("fast-paths")) {
    print_fast_paths();
    return 0;
  }
  if (args.is_set("kernels")) {
#ifdef CAST_WITH_CUDA
    for (const auto& k : cuda::flash_launch_shapes())
      fmt::print("kernel {} threads {} dynamic_shared {}\n", k.kernel, k.threads, k.dynamic_shared_bytes);
    return 0;
#else
    throw UsageError("info --kernels: this binary was built without CUDA");
#endif
  }
  fmt::print("cast {} ({} build)\n", CAST_VERSION, CAST_BUILD_TYPE);
  fmt::print("cpu:       {}, {} cores, {} memory\n", cpu_model(), std::thread::hardware_concurrency(),
             gib(host_memory_total()));
  fmt::print("vector isa: {} ({}; CMake option CAST_PORTABLE={})\n", build_vector_isa(),
             std::string(CAST_BUILD_ISA) == "native" ? "built for this machine" : "portable build",
             std::string(CAST_BUILD_ISA) == "native" ? "OFF" : "ON");
  fmt::print("blas:      OpenBLAS, {} kernels\n", ops::blas_core());
  // OMP_THREAD_LIMIT caps what a parallel region gets below OMP_NUM_THREADS' count
  const int threads = std::min(omp_get_max_threads(), omp_get_thread_limit());
  fmt::print("openmp:    {} thread{}, wait policy {}\n", threads, threads == 1 ? "" : "s", ops::openmp_wait_policy());
#ifdef CAST_WITH_CUDA
  auto gpus = cuda::devices();
  if (gpus.empty()) {
    fmt::print("cuda:      built for sm_{{{}}}; no GPU on this machine\n", CAST_CUDA_ARCHS);
  } else {
    fmt::print("cuda:      built for sm_{{{}}}; products at --precision fp32 by default (tf32, bf16: tensor cores)\n",
               CAST_CUDA_ARCHS);
    for (size_t i = 0; i < gpus.size(); ++i)
      fmt::print("  cuda:{} {} (sm_{}{}), {} total, {} free\n", i, gpus[i].name, gpus[i].major, gpus[i].minor,
                 gib(gpus[i].total_bytes), gib(gpus[i].free_bytes));
  }
#else
  fmt::print("cuda:      not built (CPU only)\n");
#endif
  return 0;
}

}  // namespace cast
