// The memory estimate that a run is checked against before it allocates.
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
#include "tests/train/train_test_util.h"

using namespace cast;
using namespace cast::testing;

// The GPU runs full attention as flash attention up to head width 128, so its memory estimate
// grows with N, not N^2; beyond that bound the step ops keep (B, H, N, N) scores and
// probabilities. (The first GPU session stopped on an estimate that charged N^2: 218 GiB for a
// Text-preset step that used 22 GiB.)
TEST(MemoryEstimate, GpuFullAttentionIsLinearInLengthWithinTheFlashBound) {
  nn::AttentionConfig a;
  a.mechanism = nn::Mechanism::full;
  a.heads = 4;
  a.fused = true;
  const double flash_1k = train::attention_layer_bytes(a, 1, 1024, 256, /*gpu=*/true);
  const double flash_4k = train::attention_layer_bytes(a, 1, 4096, 256, /*gpu=*/true);
  EXPECT_NEAR(flash_4k / flash_1k, 4.0, 1e-9);
  const double wide_1k = train::attention_layer_bytes(a, 1, 1024, 4 * 256, /*gpu=*/true);  // head width 256
  const double wide_4k = train::attention_layer_bytes(a, 1, 4096, 4 * 256, /*gpu=*/true);
  EXPECT_GT(wide_4k / wide_1k, 10.0);
  a.fused = false;  // the reference (--reference) keeps the N x N matrices on either device
  EXPECT_GT(train::attention_layer_bytes(a, 1, 4096, 256, true) / train::attention_layer_bytes(a, 1, 1024, 256, true),
            10.0);
}

// A memory refusal names the part of the step that is largest and the settings that size it.
TEST(MemoryEstimate, TheLargestPartNamesItsSettings) {
  nn::ModelConfig m;
  m.vocab = 16, m.max_len = 64, m.dim = 4096, m.heads = 8, m.mlp_dim = 16384, m.layers = 48, m.classes = 2;
  train::StepBytes wide = train::training_step_parts(m, 1, 64, false);
  EXPECT_GT(wide.parameters, wide.activations);
  EXPECT_NE(wide.largest().find("lower --dim, --mlp-dim or --layers"), std::string::npos) << wide.largest();
  m.dim = 16, m.mlp_dim = 16, m.layers = 1;
  train::StepBytes long_batch = train::training_step_parts(m, 4096, 64, false);
  EXPECT_NE(long_batch.largest().find("--batch"), std::string::npos) << long_batch.largest();
  EXPECT_DOUBLE_EQ(long_batch.total(), train::training_step_bytes(m, 4096, 64, false));
  // where attention is largest, the advice names only options the mechanism reads
  m.max_len = 8192, m.attention.fused = false;  // the reference keeps N x N scores
  m.attention.mechanism = nn::Mechanism::full;
  const train::StepBytes full = train::training_step_parts(m, 1, 8192, false);
  ASSERT_EQ(full.largest().find("the attention layers"), 0u) << full.largest();
  EXPECT_EQ(full.largest().find("--clusters"), std::string::npos) << full.largest();
  m.attention.mechanism = nn::Mechanism::iclustered, m.attention.topk = 8192, m.attention.clusters = 8192;
  const train::StepBytes iclustered = train::training_step_parts(m, 1, 8192, false);
  ASSERT_EQ(iclustered.largest().find("the attention layers"), 0u) << iclustered.largest();
  EXPECT_NE(iclustered.largest().find("or --clusters or --topk"), std::string::npos) << iclustered.largest();
}

// --recompute: each block keeps its input alone, so the activations and attention of all the
// layers but one leave the estimate; a refusal suggests the flag only where it is off.
TEST(MemoryEstimate, RecomputedBlocksKeepTheirInputsAlone) {
  nn::ModelConfig m;
  m.vocab = 16, m.max_len = 1024, m.dim = 64, m.heads = 4, m.mlp_dim = 256, m.layers = 6, m.classes = 2;
  m.attention.mechanism = nn::Mechanism::cast;
  const train::StepBytes kept = train::training_step_parts(m, 8, 1024, false);
  m.recompute = true;
  const train::StepBytes again = train::training_step_parts(m, 8, 1024, false);
  EXPECT_EQ(again.parameters, kept.parameters);
  EXPECT_LT(again.activations, kept.activations / 3);
  EXPECT_LT(again.attention, kept.attention / 3);
  EXPECT_NE(kept.largest().find(", or add --recompute"), std::string::npos) << kept.largest();
  EXPECT_EQ(again.largest().find("--recompute"), std::string::npos) << again.largest();
}
