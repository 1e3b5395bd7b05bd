#pragma once
// What training did to a CAST model's clusters: the model against itself at initialisation
// (the same settings and seed build the same starting weights) on the same test images.
#include <cstdint>
#include <vector>

#include "nn/transformer.h"

namespace cast::train {

// Each token's first cluster in one layer's CAST clusters (B, H, C, κ) i32: (B, H, tokens),
// −1 where no cluster holds it. `offset` is 1 under CLS pooling (token 0 is the CLS).
std::vector<int> first_clusters(const Tensor& clusters, int64_t tokens, int offset);

// Of (B, H, tokens) owners: the share of each (head, position) held by its commonest cluster
// across the B images, averaged. 1: a position always lands in the same cluster (clusters are
// places); near 1 / C: the cluster depends on the content.
double position_purity(const std::vector<int>& owners, int64_t B, int64_t H, int64_t tokens);

struct LayerChange {
  double changed = 0;  // share of (image, head, token) whose first cluster differs
  double purity_initial = 0, purity_trained = 0;
};

// Runs both models forward on `batch` (no gradients) and compares their clusters layer by layer.
std::vector<LayerChange> cluster_changes(nn::Transformer& initial, nn::Transformer& trained, const nn::Batch& batch);

}  // namespace cast::train
