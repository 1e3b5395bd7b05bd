#include <gtest/gtest.h>
#include "ops/ops.h"
TEST(Smoke, Builds) { EXPECT_EQ(cast::Tensor::zeros({2, 3}).numel(), 6); }
