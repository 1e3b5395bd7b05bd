#include "figures/cluster_changes.h"

#include <algorithm>
#include <map>

#include "autograd/tape.h"
#include "tensor/error.h"

namespace cast::train {

std::vector<int> first_clusters(const Tensor& clusters, int64_t tokens, int offset) {
  const int64_t B = clusters.dim(0), H = clusters.dim(1), C = clusters.dim(2), K = clusters.dim(3);
  const auto ids = clusters.to_double_vector();
  std::vector<int> owner(static_cast<size_t>(B * H * tokens), -1);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t token = static_cast<int64_t>(ids[(bh * C + c) * K + k]) - offset;
        if (token < 0 || token >= tokens) continue;  // an empty slot (−1) or the CLS
        int& o = owner[bh * tokens + token];
        if (o < 0) o = static_cast<int>(c);
      }
  return owner;
}

double position_purity(const std::vector<int>& owners, int64_t B, int64_t H, int64_t tokens) {
  CAST_CHECK(static_cast<int64_t>(owners.size()) == B * H * tokens, "position purity: {} owners, not {} x {} x {}",
             owners.size(), B, H, tokens);
  double sum = 0;
  int64_t pairs = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < tokens; ++t) {
      std::map<int, int64_t> count;
      int64_t clustered = 0;
      for (int64_t b = 0; b < B; ++b) {
        const int owner = owners[(b * H + h) * tokens + t];
        if (owner < 0) continue;  // in no cluster: not a place of any cluster
        ++count[owner];
        ++clustered;
      }
      if (clustered == 0) continue;
      int64_t most = 0;
      for (const auto& [cluster, n] : count) most = std::max(most, n);
      sum += static_cast<double>(most) / static_cast<double>(clustered);
      ++pairs;
    }
  return pairs ? sum / static_cast<double>(pairs) : 0.0;
}

std::vector<LayerChange> cluster_changes(nn::Transformer& initial, nn::Transformer& trained,
                                         const std::vector<nn::Batch>& batches) {
  CAST_CHECK(initial.blocks().size() == trained.blocks().size(), "cluster changes: models of {} and {} layers",
             initial.blocks().size(), trained.blocks().size());
  const nn::ModelConfig& m = trained.config();
  const size_t layers = trained.blocks().size();
  const int offset = m.cls_pooling ? 1 : 0;
  int64_t tokens = -1, B = 0;
  std::vector<std::vector<int>> before(layers), after(layers);  // (B, H, tokens) each, batch after batch
  for (const nn::Batch& batch : batches) {
    const int64_t n = batch.tokens.dim(1) / (m.patch * m.patch);
    CAST_CHECK(tokens < 0 || n == tokens, "cluster changes: batches of {} and {} tokens", tokens, n);
    tokens = n;
    B += batch.tokens.dim(0);
    {
      autograd::NoGradGuard no_grad;
      initial.forward(batch, false);
      trained.forward(batch, false);
    }
    for (size_t l = 0; l < layers; ++l) {
      const auto a = first_clusters(initial.blocks()[l]->last.clusters, tokens, offset);
      const auto b = first_clusters(trained.blocks()[l]->last.clusters, tokens, offset);
      before[l].insert(before[l].end(), a.begin(), a.end());
      after[l].insert(after[l].end(), b.begin(), b.end());
    }
  }
  std::vector<LayerChange> out;
  for (size_t l = 0; l < layers && B > 0; ++l) {
    LayerChange change;
    int64_t differ = 0;
    for (size_t i = 0; i < before[l].size(); ++i) differ += before[l][i] != after[l][i];
    change.changed = static_cast<double>(differ) / static_cast<double>(before[l].size());
    change.purity_initial = position_purity(before[l], B, m.heads, tokens);
    change.purity_trained = position_purity(after[l], B, m.heads, tokens);
    out.push_back(change);
  }
  return out;
}

}  // namespace cast::train
