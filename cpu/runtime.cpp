#include "cpu/runtime.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

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

// Whether some sample of /proc/stat's procs_running, up to five 2 ms apart, finds no more
// processes running besides this one than `spare` (false where the file cannot be read). A
// process that keeps a core busy shows in every sample; one that runs for a moment does not: the
// other end of a pipe (`cast train | tee log`) is running as it starts with this one, and
// then waits for input.
bool others_within(int64_t spare) {
  for (int sample = 0; sample < 5; ++sample) {
    if (sample > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::ifstream stat("/proc/stat");
    int64_t running = -1;
    for (std::string key; stat >> key;)
      if (key == "procs_running") {
        stat >> running;
        break;
      }
    if (running < 1) return false;
    if (running - 1 <= spare) return true;
  }
  return false;
}

// Whether this run's OpenMP threads find their cores free: no more processes running besides
// this one than there are cores the threads leave over.
bool cores_free_for_threads() {
  const int64_t cores = sysconf(_SC_NPROCESSORS_ONLN);
  const char* set = std::getenv("OMP_NUM_THREADS");
  const int64_t threads = set ? std::max<int64_t>(1, std::atoll(set)) : cores;
  if (threads > cores) return false;  // the threads share cores among themselves already
  return others_within(cores - threads);
}

}  // namespace

// Set where OPENBLAS_CORETYPE is cast's own choice, not the user's.
constexpr const char* kCoreSetByCast = "CAST_SET_OPENBLAS_CORETYPE";

// The descriptor of the standard error a restart set aside.
constexpr const char* kSavedStderr = "CAST_SAVED_STDERR";

void restart_with_cpu_runtime(char** argv) {
  if (std::getenv("CAST_RUNTIME_SET") != nullptr) return;  // already restarted once
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    if (cores_free_for_threads()) {
      setenv("OMP_WAIT_POLICY", "active", 1);
      if (std::getenv("GOMP_SPINCOUNT") == nullptr) setenv("GOMP_SPINCOUNT", kSpinCount, 1);
    } else {
      setenv("OMP_WAIT_POLICY", "passive", 1);
    }
    changed = true;
  }
  const char* core = wanted_blas_core();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && core && blas_core_is_weak(openblas_get_corename())) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv(kCoreSetByCast, "1", 1);  // not the user's: a build that ignores it is no user's mistake
    changed = true;
  }
  if (!changed) return;
  setenv("CAST_RUNTIME_SET", "1", 1);
  // The OpenMP runtime warned about the environment as this process loaded (an OMP_PROC_BIND it
  // cannot read, say); the restarted process would warn again. Until its main restores it
  // (restore_stderr_after_restart), its standard error is /dev/null. What it loads with differs
  // from this process only in the variables set above, to values the libraries accept.
  const int saved = ::fcntl(STDERR_FILENO, F_DUPFD, 10);  // not close-on-exec: it survives execv
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const bool quiet = saved >= 0 && null >= 0 && ::dup2(null, STDERR_FILENO) == STDERR_FILENO;
  if (null >= 0) ::close(null);
  if (quiet) setenv(kSavedStderr, std::to_string(saved).c_str(), 1);
  else if (saved >= 0) ::close(saved);  // not set aside: the restarted process would not close it
  execv("/proc/self/exe", argv);  // returns only on failure: run on with the defaults
  if (quiet) {
    ::dup2(saved, STDERR_FILENO);
    unsetenv(kSavedStderr);
    ::close(saved);
  }
}

void restore_stderr_after_restart() {
  const char* fd = std::getenv(kSavedStderr);
  if (fd == nullptr) return;
  const int saved = std::atoi(fd);
  unsetenv(kSavedStderr);  // not for the processes this one starts
  if (saved < 3) return;
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
}

std::string blas_core() { return openblas_get_corename(); }

std::string blas_core_refusal() {
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked == nullptr || std::getenv(kCoreSetByCast) != nullptr) return "";
  const std::string running = openblas_get_corename();
  if (strcasecmp(asked, running.c_str()) == 0) return "";
  return "OpenBLAS runs its " + running +
         " kernels, not these (it knows no core of that name, or this build chooses its own); unset it, or name "
         "a core it knows, such as " +
         running;
}

std::string openmp_wait_policy() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  std::string policy = p ? p : "default";
  return spin ? policy + ", spin count " + spin : policy;
}

}  // namespace cast::ops
