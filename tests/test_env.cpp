// Global test setup: every tensor allocated by a test starts poisoned (NaN / invalid index),
// so an op that leaves part of its output unwritten fails its comparison.
#include <gtest/gtest.h>

#include "tensor/tensor.h"

namespace {
class PoisonEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { cast::set_poison_new_tensors(true); }
};
const auto* const kPoison = ::testing::AddGlobalTestEnvironment(new PoisonEnvironment);
}  // namespace
