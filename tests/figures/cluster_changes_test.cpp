// How training moved CAST's clusters, and the figure that colours each patch by its cluster.
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

// ---------------------------------------------------------------- what training did to the clusters

TEST(ClusterChanges, FirstClustersSkipEmptySlotsAndTheCls) {
  // (B 1, H 2, C 2, κ 2); under CLS pooling token 0 is the CLS, so ids 1..3 are tokens 0..2
  const Tensor clusters = Tensor::from_vector<int32_t>({2, 0, 3, 2, /* head 2 */ -1, 1, 1, 3}, {1, 2, 2, 2});
  EXPECT_EQ(train::first_clusters(clusters, 3, 1), (std::vector<int>{-1, 0, 1, /* head 2 */ 0, -1, 1}));
  EXPECT_EQ(train::first_clusters(clusters, 4, 0), (std::vector<int>{0, -1, 0, 1, /* head 2 */ -1, 0, -1, 1}));
}

TEST(ClusterChanges, PositionPurityIsTheCommonestClustersShare) {
  // B 4 images, H 1, 3 positions: position 0 always in cluster 3; position 1 in 0, 1, 1 and
  // none (2 of the 3 clustered); position 2 never clustered, so not counted
  const std::vector<int> owners = {3, 0, -1, 3, 1, -1, 3, 1, -1, 3, -1, -1};
  EXPECT_DOUBLE_EQ(train::position_purity(owners, 4, 1, 3), (1.0 + 2.0 / 3.0) / 2);
  EXPECT_CAST_ERROR(train::position_purity(owners, 4, 1, 2), "position purity: 12 owners, not 4 x 1 x 2");
}

TEST(ClusterChanges, TrainingMovesTokensAndTheFigureColoursEachPatch) {
  data::TaskData task = quadrant_task(600, 64, 7);
  train::TrainConfig c = tiny_config(nn::Mechanism::cast, temp_dir("cluster_changes"));
  c.task = "quadrants";
  c.steps = 100;
  c.model.vocab = 256, c.model.classes = 4, c.model.max_len = 64, c.model.patch = 2;  // 16 tokens of 4 pixels
  train::train_on(c, task, "", 0, true);
  auto ck = train::read_checkpoint_header(c.run_dir + "/checkpoint.safetensors");
  nn::Transformer trained(ck.config.model), initial(ck.config.model), again(ck.config.model);
  train::load_checkpoint(c.run_dir + "/checkpoint.safetensors", trained, nullptr, nullptr);
  std::vector<nn::Batch> batch;  // 64 images in two batches
  for (int64_t at : {0, 32}) {
    std::vector<int64_t> some;
    for (int64_t i = at; i < at + 32; ++i) some.push_back(i);
    batch.push_back(data::make_batch(task, task.test, some, DType::f32, Device::cpu));
  }
  // the initialisation against itself: nothing changed
  const auto same = train::cluster_changes(initial, again, batch);
  ASSERT_EQ(same.size(), 1u);
  EXPECT_EQ(same[0].changed, 0.0);
  EXPECT_EQ(same[0].purity_initial, same[0].purity_trained);
  const auto moved = train::cluster_changes(initial, trained, batch);
  EXPECT_GT(moved[0].changed, 0.0);
  EXPECT_LE(moved[0].changed, 1.0);
  EXPECT_GT(moved[0].purity_trained, 0.0);
  // the figure: one square per pixel in the input, one per token (patch) in each head's panel,
  // and the legend's
  {
    autograd::NoGradGuard no_grad;
    trained.forward(data::make_batch(task, task.test, {0}, DType::f32, Device::cpu), false);
  }
  const std::string svg = train::clusters_svg(trained, {task.test[0].tokens, 8, 2, 0, "test"});
  size_t squares = 0;
  for (size_t at = svg.find("<rect x="); at != std::string::npos; at = svg.find("<rect x=", at + 1)) ++squares;
  EXPECT_EQ(squares, static_cast<size_t>(64 + 16 * c.model.heads + c.model.attention.clusters));
}

// `cast clusters --initial` rebuilds the starting weights from the checkpoint's settings: the
// weights a run of no steps saves.
TEST(ClusterChanges, TheCheckpointsSettingsRebuildTheWeightsTrainingStartedFrom) {
  data::TaskData task = quadrant_task(64, 16, 9);
  train::TrainConfig c = tiny_config(nn::Mechanism::cast, temp_dir("initial_weights"));
  c.task = "quadrants";
  c.steps = 0;
  c.model.seed = 4;
  c.model.vocab = 256, c.model.classes = 4, c.model.max_len = 64, c.model.patch = 2;
  train::train_on(c, task, "", 0, true);
  const std::string path = c.run_dir + "/checkpoint.safetensors";
  const auto ck = train::read_checkpoint_header(path);
  nn::Transformer saved(ck.config.model), rebuilt(ck.config.model);
  train::load_checkpoint(path, saved, nullptr, nullptr);
  auto a = saved.parameters(), b = rebuilt.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].second->to_double_vector(), b[i].second->to_double_vector()) << a[i].first;
}
