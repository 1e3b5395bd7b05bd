// The test binary's entry point: the same CPU runtime as the cast binary (the OpenMP wait
// policy for the machine's load, the BLAS kernels for this CPU), then GoogleTest.
#include <gtest/gtest.h>

#include "ops/cpu_runtime.h"

int main(int argc, char** argv) {
  cast::ops::restart_with_cpu_runtime(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
