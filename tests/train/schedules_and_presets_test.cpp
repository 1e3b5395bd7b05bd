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

// The LRA presets hold the values of the release's configuration files
// (lra_benchmarks/*/configs/: each task's transformer_base over its base config), as
// docs/training.md lists them; fashion-mnist-lra is the image row on Fashion-MNIST's 55 000
// training images (an epoch of 214 steps).
TEST(Training, LraPresetsFollowTheReleaseConfigurations) {
  struct Row {
    const char* task;
    int64_t layers, dim, heads, mlp, batch, steps, warmup;
    double lr, weight_decay, clip, dropout;
    bool cls, learned_positions;
  };
  const Row rows[] = {
      {"listops", 4, 512, 8, 1024, 32, 5000, 1000, 0.05, 0.1, 0, 0.1, true, false},
      {"text", 4, 256, 4, 1024, 32, 20000, 8000, 0.05, 0.1, 0, 0.1, true, false},
      {"retrieval", 4, 128, 4, 512, 32, 5000, 8000, 0.05, 0.1, 0, 0.1, true, false},
      {"image", 1, 128, 8, 128, 256, 35000, 175, 5e-4, 0, 0, 0.3, true, true},
      {"pathfinder", 4, 32, 4, 32, 512, 62400, 312, 1e-3, 0, 0, 0.2, false, false},
      {"pathx", 1, 32, 2, 32, 64, 500000, 2500, 1e-3, 0, 1, 0.1, false, true},
      {"fashion-mnist-lra", 1, 128, 8, 128, 256, 42800, 214, 5e-4, 0, 0, 0.3, true, true},
  };
  for (const Row& r : rows) {
    const train::TrainConfig c = train::preset(r.task);
    SCOPED_TRACE(r.task);
    EXPECT_EQ(c.model.layers, r.layers);
    EXPECT_EQ(c.model.dim, r.dim);
    EXPECT_EQ(c.model.heads, r.heads);
    EXPECT_EQ(c.model.mlp_dim, r.mlp);
    EXPECT_EQ(c.batch, r.batch);
    EXPECT_EQ(c.steps, r.steps);
    EXPECT_EQ(c.warmup, r.warmup);
    EXPECT_DOUBLE_EQ(c.lr, r.lr);
    EXPECT_DOUBLE_EQ(c.weight_decay, r.weight_decay);
    EXPECT_DOUBLE_EQ(c.clip, r.clip);
    EXPECT_DOUBLE_EQ(c.model.dropout, r.dropout);
    EXPECT_EQ(c.model.cls_pooling, r.cls);
    EXPECT_EQ(c.model.learned_positions, r.learned_positions);
    EXPECT_EQ(c.schedule, std::string(r.lr == 0.05 ? "rsqrt" : "cosine"));
  }
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
