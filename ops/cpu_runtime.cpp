#include "ops/cpu_runtime.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace cast::ops {

namespace {

// The best OpenBLAS kernel set this CPU can run, or null to leave OpenBLAS's choice alone.
const char* wanted_blas_core() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

// OpenBLAS's choice is kept when it already uses a wide-vector kernel set.
bool blas_core_is_weak(const char* core) {
  for (const char* weak : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Coppermine",
                           "Northwood", "Banias", "Sandybridge", "Unknown"})
    if (strcasecmp(core, weak) == 0) return true;
  return false;
}

}  // namespace

void restart_with_cpu_runtime(char** argv) {
  if (std::getenv("CAST_RUNTIME_SET") != nullptr) return;  // already restarted once
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    changed = true;
  }
  const char* core = wanted_blas_core();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && core && blas_core_is_weak(openblas_get_corename())) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    changed = true;
  }
  if (!changed) return;
  setenv("CAST_RUNTIME_SET", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: run on with the defaults
}

std::string blas_core() { return openblas_get_corename(); }

std::string openmp_wait_policy() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  return p ? p : "default";
}

}  // namespace cast::ops
