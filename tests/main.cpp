// The test binary's entry point: the same CPU runtime as the cast binary (the OpenMP wait
// policy for the machine's load, the BLAS kernels for this CPU), a temporary folder of this
// process's own, then GoogleTest.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "cpu/runtime.h"

namespace fs = std::filesystem;

// Tests write their files under fs::temp_directory_path(), and the cast processes they start
// inherit the environment: pointing TMPDIR at a folder named for this process puts every file
// of the run in one place, removed when the tests pass. Without it each of the ~700 ctest
// processes left its folders behind, thousands per run of the suite.
static fs::path enter_private_temp_folder() {
  const fs::path folder = fs::temp_directory_path() / ("cast_tests_" + std::to_string(getpid()));
  fs::remove_all(folder);  // a folder of an earlier process with this pid, never ours
  fs::create_directories(folder);
  setenv("TMPDIR", folder.c_str(), 1);
  return folder;
}

int main(int argc, char** argv) {
  cast::ops::restore_stderr_after_restart();  // the restarted test process's own standard error
  cast::ops::restart_with_cpu_runtime(argv);
  const fs::path folder = enter_private_temp_folder();
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  if (failed) {
    std::fprintf(stderr, "test files kept in %s\n", folder.c_str());
  } else {
    std::error_code ignored;  // a file still open elsewhere must not turn a pass into a failure
    fs::remove_all(folder, ignored);
  }
  return failed;
}
