#include "train/cluster_changes.h"

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
  double sum = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < tokens; ++t) {
      std::map<int, int64_t> count;
      for (int64_t b = 0; b < B; ++b) ++count[owners[(b * H + h) * tokens + t]];
      int64_t most = 0;
      for (const auto& [cluster, n] : count) most = std::max(most, n);
      sum += static_cast<double>(most) / static_cast<double>(B);
    }
  return sum / static_cast<double>(H * tokens);
}

std::vector<LayerChange> cluster_changes(nn::Transformer& initial, nn::Transformer& trained, const nn::Batch& batch) {
  CAST_CHECK(initial.blocks().size() == trained.blocks().size(), "cluster changes: models of {} and {} layers",
             initial.blocks().size(), trained.blocks().size());
  {
    autograd::NoGradGuard no_grad;
    initial.forward(batch, false);
    trained.forward(batch, false);
  }
  const nn::ModelConfig& m = trained.config();
  const int64_t B = batch.tokens.dim(0), H = m.heads, tokens = batch.tokens.dim(1) / (m.patch * m.patch);
  const int offset = m.cls_pooling ? 1 : 0;
  std::vector<LayerChange> out;
  for (size_t layer = 0; layer < trained.blocks().size(); ++layer) {
    const auto a = first_clusters(initial.blocks()[layer]->last.clusters, tokens, offset);
    const auto b = first_clusters(trained.blocks()[layer]->last.clusters, tokens, offset);
    LayerChange change;
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
    change.changed = static_cast<double>(differ) / static_cast<double>(a.size());
    change.purity_initial = position_purity(a, B, H, tokens);
    change.purity_trained = position_purity(b, B, H, tokens);
    out.push_back(change);
  }
  return out;
}

}  // namespace cast::train
