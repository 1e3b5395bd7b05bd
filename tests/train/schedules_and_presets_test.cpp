// The learning-rate schedules, and the task presets with their overrides.
#include <unistd.h>  // getpid: the plain and the emulated test process run side by side
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tensor/philox.h"
#include "tensor/safetensors.h"
#include "tests/test_util.h"
#include "figures/cluster_changes.h"
#include "figures/clusters_figure.h"
#include "train/memory_estimate.h"
#include "train/stop.h"
#include "train/trainer.h"
#include "train/training_step.h"
#include "tests/train/train_test_util.h"

using namespace cast;
using namespace cast::testing;

TEST(Training, LearningRateSchedules) {
  train::TrainConfig c;
  c.lr = 0.05, c.warmup = 1000, c.steps = 5000, c.schedule = "rsqrt";
  EXPECT_NEAR(train::learning_rate(c, 1000), 0.05 / std::sqrt(1000.0), 1e-12);  // the LRA peak ≈ 1.6e-3
  EXPECT_NEAR(train::learning_rate(c, 4000), 0.05 / std::sqrt(4000.0), 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 500), 0.5 * 0.05 / std::sqrt(1000.0), 1e-12);
  c.schedule = "cosine", c.lr = 1e-3;
  EXPECT_NEAR(train::learning_rate(c, 1000), 1e-3, 1e-15);
  EXPECT_NEAR(train::learning_rate(c, 3000), 5e-4, 1e-12);
  EXPECT_NEAR(train::learning_rate(c, 5000), 0.0, 1e-15);
}

TEST(Training, PresetsAndOverrides) {
  train::TrainConfig c = train::preset("listops");
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.dim, 512);
  train::apply_overrides(c, nlohmann::json{{"attention", "iclustered"}, {"steps", 10}, {"dim", 64}});
  EXPECT_EQ(c.model.attention.mechanism, nn::Mechanism::iclustered);
  EXPECT_EQ(c.steps, 10);
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json{{"stepz", 1}}), "unknown setting 'stepz'");
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json{{"steps", "many"}}), "it must be an integer");
  EXPECT_CAST_ERROR(train::apply_overrides(c, nlohmann::json{{"lr", "fast"}}), "wrong type");
  EXPECT_CAST_ERROR(train::preset("sudoku"), "unknown task");
}

// AdamW decays the matrices only: never a bias, a norm or the CLS vector, whose shape (1, 1, D)
// has two dimensions or more (docs/training.md).
TEST(Training, WeightDecayReachesTheMatricesOnly) {
  nn::ModelConfig m;
  m.vocab = 8, m.max_len = 8, m.dim = 8, m.heads = 2, m.mlp_dim = 8, m.layers = 1, m.classes = 2;
  m.cls_pooling = true;
  nn::Transformer model(m, DType::f32, Device::cpu);
  int decayed = 0;
  for (const auto& [name, t] : model.parameters()) {
    const bool matrix = t->ndim() >= 2 && name != "cls";
    EXPECT_EQ(train::decayed(name, *t), matrix) << name << " " << shape_str(t->shape());
    decayed += train::decayed(name, *t);
  }
  EXPECT_GT(decayed, 0);
  EXPECT_FALSE(train::decayed("cls", Tensor::zeros({1, 1, 8})));
}
