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

// Of (B, H, tokens) owners: for each (head, position), among the images where some cluster
// holds it, the share held by its commonest cluster; averaged over the (head, position) pairs
// clustered at least once. 1: a position always lands in the same cluster (clusters are places);
// lower: the content decides.
double position_purity(const std::vector<int>& owners, int64_t B, int64_t H, int64_t tokens);

struct LayerChange {
  double changed = 0;  // share of (image, head, token) whose first cluster differs
  double purity_initial = 0, purity_trained = 0;
};

// Runs both models forward on each batch (no gradients; a batch at a time bounds the memory)
// and compares their clusters layer by layer over all of them.
std::vector<LayerChange> cluster_changes(nn::Transformer& initial, nn::Transformer& trained,
                                         const std::vector<nn::Batch>& batches);

}  // namespace cast::train
