#pragma once
// What the training tests share (tests/train/): a tiny counting task, a tiny model's settings,
// and a temporary folder of this test process's own.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tensor/philox.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace cast::testing {

// Sequences of 16 tokens from {1, 2, 3}; the label says whether 1 occurs more often than 2.
inline data::TaskData counting_task(int64_t train, int64_t test, uint64_t seed) {
  data::TaskData t;
  t.name = "counting";
  t.vocab = 4;
  t.classes = 2;
  t.max_len = 16;
  uint64_t draw = 0;
  auto make = [&](int64_t n, std::vector<data::Example>& out) {
    while (static_cast<int64_t>(out.size()) < n) {
      data::Example e;
      int ones = 0, twos = 0;
      for (int i = 0; i < 16; ++i) {
        const int tok = 1 + static_cast<int>(philox::uniform(seed, draw++) * 3);
        e.tokens.push_back(tok);
        ones += tok == 1;
        twos += tok == 2;
      }
      if (ones == twos) continue;
      e.label = ones > twos ? 1 : 0;
      out.push_back(e);
    }
  };
  make(train, t.train);
  make(test, t.val);
  make(test, t.test);
  return t;
}

inline train::TrainConfig tiny_config(nn::Mechanism mechanism, const std::string& run_dir) {
  train::TrainConfig c;
  c.task = "counting";
  c.run_dir = run_dir;
  c.steps = 300;
  c.batch = 32;
  c.lr = 3e-3;
  c.warmup = 20;
  c.schedule = "constant";
  c.weight_decay = 0.0;
  c.checkpoint_every = 0;
  c.log_every = 50;
  c.device = "cpu";
  nn::ModelConfig& m = c.model;
  m.vocab = 4, m.max_len = 16, m.dim = 32, m.heads = 2, m.mlp_dim = 64, m.layers = 1, m.classes = 2;
  m.cls_pooling = true;
  m.dropout = 0.0;
  m.attention.mechanism = mechanism;
  m.attention.clusters = 4;
  m.attention.cluster_size = 6;
  m.attention.topk = 8;
  m.attention.bits = 16;
  return c;
}

inline std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("cast_train_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

// 8 × 8 grey images of noise with one bright 4 × 4 quadrant; the label is the quadrant.
inline data::TaskData quadrant_task(int64_t train, int64_t test, uint64_t seed) {
  data::TaskData t;
  t.name = "quadrants";
  t.vocab = 256;
  t.classes = 4;
  t.image_side = 8;
  t.max_len = 64;
  t.fixed_length = true;
  uint64_t draw = 0;
  auto make = [&](int64_t n, std::vector<data::Example>& out) {
    for (int64_t i = 0; i < n; ++i) {
      data::Example e;
      e.label = static_cast<int32_t>(philox::uniform(seed, draw++) * 4);
      for (int p = 0; p < 64; ++p) {
        const bool bright = (p / 8 / 4) * 2 + (p % 8) / 4 == e.label;
        e.tokens.push_back(static_cast<int32_t>(philox::uniform(seed, draw++) * 128) + (bright ? 96 : 0));
      }
      out.push_back(e);
    }
  };
  make(train, t.train);
  make(test, t.val);
  make(test, t.test);
  return t;
}

}  // namespace cast::testing
