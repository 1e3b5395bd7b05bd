#include "nn/transformer.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "autograd/recompute.h"
#include "autograd/tape.h"
#include "ops/ops.h"

namespace cast::nn {

using json = nlohmann::json;

// The fields by their C++ names, for messages and tests. A checkpoint stores a model by the
// names of its settings (train/settings.h).
json ModelConfig::to_json() const {
  const AttentionConfig& a = attention;
  return json{{"vocab", vocab},
              {"max_len", max_len},
              {"patch", patch},
              {"dim", dim},
              {"heads", heads},
              {"mlp_dim", mlp_dim},
              {"layers", layers},
              {"classes", classes},
              {"learned_positions", learned_positions},
              {"cls_pooling", cls_pooling},
              {"dual", dual},
              {"dropout", dropout},
              {"seed", seed},
              {"attention",
               {{"mechanism", mechanism_name(a.mechanism)},
                {"clusters", a.clusters},
                {"cluster_size", a.cluster_size},
                {"single_assignment", a.single_assignment},
                {"f", a.f == ops::AttentionFn::laplace ? "laplace" : "softmax"},
                {"summaries", a.summaries},
                {"mix_query", a.mix_query},
                {"shared_clustering", a.shared_clustering},
                {"frozen_surrogates", a.frozen_surrogates},
                {"topk", a.topk},
                {"bits", a.bits},
                {"iterations", a.iterations}}}};
}

int64_t ModelConfig::cluster_count() const {
  if (attention.mechanism == Mechanism::full) return attention.clusters;
  return attention.clusters > 0 ? attention.clusters : default_clusters(tokens() + (cls_pooling ? 1 : 0));
}

Block::Block(const ModelConfig& c, int index, Initializer& init)
    : norm1(c.dim, init), norm2(c.dim, init), mlp(c.dim, c.mlp_dim, init), dropout(c.dropout), seed(c.seed) {
  AttentionConfig a = c.attention;
  a.dim = c.dim;
  a.heads = c.heads;
  a.seed = c.seed * 1000 + static_cast<uint64_t>(index) + 1;
  a.clusters = c.cluster_count();
  attention = std::make_unique<Attention>(a, init.dtype, init.device);
  mlp.up.fused = mlp.down.fused = c.attention.fused;
  recompute = c.recompute;
  fused = c.attention.fused;
}

Tensor Block::forward(const Tensor& x, const Tensor& mask, bool train, uint64_t& rng) {
  if (!recompute || !autograd::grad_enabled()) return run(x, mask, train, rng);
  const uint64_t rng_before = rng, draws_before = attention->clustering_draws();
  Tensor out;
  {
    autograd::NoGradGuard unrecorded;
    out = run(x, mask, train, rng);
  }
  std::vector<const Tensor*> leaves;
  for (const auto& [name, p] : parameters()) leaves.push_back(p);
  // The backward's second run draws what the first drew: dropout's masks from the same counter,
  // LSH's planes and k-means' seeds from the same draw, so it forms the same values. It leaves
  // the counters, and the clusters `cast clusters` reads, as the first run left them.
  return autograd::recompute_in_backward(
      "block", x, out, leaves, [this, mask, train, rng_before, draws_before](const Tensor& in) {
        // what the first run left, put back however the second ends (an error included)
        struct Restore {
          Block& block;
          AttentionOutput last;
          uint64_t draws;
          ~Restore() {
            block.last = std::move(last);
            block.attention->set_clustering_draws(draws);
          }
        } restore{*this, std::move(last), attention->clustering_draws()};
        uint64_t counter = rng_before;
        attention->set_clustering_draws(draws_before);
        return run(in, mask, train, counter);
      });
}

Tensor Block::run(const Tensor& x, const Tensor& mask, bool train, uint64_t& rng) {
  // x + dropout(t): one op on the fast path (ops::dropout_add), the same values as its two
  auto residual = [&](const Tensor& stream, const Tensor& t) {
    if (!train || dropout == 0.0) return ops::add(stream, t);
    Tensor y = fused ? ops::dropout_add(stream, t, dropout, seed, rng)
                     : ops::add(stream, ops::dropout(t, dropout, seed, rng));
    rng += static_cast<uint64_t>(t.numel());
    return y;
  };
  const Tensor normed = norm1.forward(x);
  if (keep_attention_input) attention_input = normed, attention_mask = mask;
  last = attention->forward(normed, mask);
  Tensor h = residual(x, last.out);
  last.out = Tensor();  // read by nobody later; under --recompute nothing else would hold it
  return residual(h, mlp.forward(norm2.forward(h)));
}

void Block::collect_parameters(ParamList& out, const std::string& prefix) {
  norm1.collect_parameters(out, join_name(prefix, "norm1"));
  attention->collect_parameters(out, join_name(prefix, "attention"));
  norm2.collect_parameters(out, join_name(prefix, "norm2"));
  mlp.collect_parameters(out, join_name(prefix, "mlp"));
}

// Fixed sinusoidal positions (Vaswani et al.): sin on even, cos on odd features.
static Tensor sinusoidal(int64_t len, int64_t dim, DType dtype, Device device) {
  std::vector<double> v(len * dim);
  for (int64_t p = 0; p < len; ++p)
    for (int64_t i = 0; i < dim; ++i) {
      const double rate = std::pow(10000.0, -static_cast<double>(i / 2 * 2) / static_cast<double>(dim));
      v[p * dim + i] = i % 2 == 0 ? std::sin(p * rate) : std::cos(p * rate);
    }
  return Tensor::from_vector<double>(v, {len, dim}).to(dtype).to(device);
}

// (levels, 1): pixel value v as the number v · (1 / 255), multiplied in the model's precision.
static Tensor grey_levels(int64_t levels, DType dtype, Device device) {
  std::vector<double> grey(levels);
  for (int64_t v = 0; v < levels; ++v)
    grey[v] = dtype == DType::f32 ? static_cast<double>(static_cast<float>(1.0 / 255.0) * static_cast<float>(v))
                                  : (1.0 / 255.0) * static_cast<double>(v);
  return Tensor::from_vector<double>(grey, {levels, 1}).to(dtype).to(device);
}

Transformer::Transformer(const ModelConfig& c, DType dtype, Device device) : config_(c) {
  CAST_CHECK(c.vocab > 0 && c.max_len > 0 && c.layers >= 0 && c.classes >= 2 && c.patch >= 1 && c.tokens() >= 1,
             "model: invalid config {}", c.to_json().dump());
  Initializer init{c.seed, 0, dtype, device};
  if (c.patch > 1) {
    patch_embedding_ = Linear(c.patch * c.patch, c.dim, true, init);
    grey_levels_ = grey_levels(c.vocab, dtype, device);
  } else {
    token_table_ = init.normal({c.vocab, c.dim}, 1.0);
  }
  const int64_t n = c.tokens();
  position_table_ = c.learned_positions ? init.normal({n, c.dim}, 0.02) : sinusoidal(n, c.dim, dtype, device);
  if (c.cls_pooling) cls_ = init.normal({1, 1, c.dim}, 0.02);
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
  positions_ = Tensor::from_vector<int32_t>(positions, {n}, device);  // sent once, not per batch
  for (int i = 0; i < c.layers; ++i) blocks_.push_back(std::make_unique<Block>(c, i, init));
  final_norm_ = LayerNorm(c.dim, init);
  const int64_t head_in = c.dual ? 4 * c.dim : c.dim;
  head1_ = Linear(head_in, c.mlp_dim, true, init);
  head2_ = Linear(c.mlp_dim, c.classes, true, init);
  patch_embedding_.fused = head1_.fused = head2_.fused = c.attention.fused;
}

// (B, rows, P, cols, P) -> (B, rows, cols, P, P)
Tensor patch_major(const Tensor& x, int64_t side, int64_t patch) {
  const int64_t B = x.dim(0), cells = side / patch;
  Tensor grid = ops::reshape(x, {B, cells, patch, cells, patch});
  return ops::reshape(ops::permute(grid, {0, 1, 3, 2, 4}), {B, cells * cells, patch * patch});
}

Tensor Transformer::embed_patches(const Tensor& pixels, const Tensor& mask, Tensor& patch_mask) const {
  const int64_t B = pixels.dim(0), width = pixels.dim(1), P = config_.patch;
  // the positions belong to one image size: a smaller image would shift them silently
  CAST_CHECK(width == config_.max_len,
             "model: an input of {} pixels, but the model reads images of {} in {}x{} patches", width, config_.max_len,
             P, P);
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(width))));
  // grey levels as numbers in [0, 1], looked up where the pixels are (no copy to the host)
  const Tensor grey = ops::reshape(ops::embedding(grey_levels_, pixels), {B, width});
  // the share of each patch's pixels that are real: 1 in image tasks, which have no padding
  patch_mask = ops::mean(patch_major(mask, side, P), 2);
  return patch_embedding_.forward(patch_major(grey, side, P));
}

Tensor Transformer::encode(const Tensor& tokens, const Tensor& mask, bool train) {
  const int64_t B = tokens.dim(0);
  Tensor m = mask, embedded;
  if (config_.patch > 1) embedded = embed_patches(tokens, mask, m);  // m becomes the patches' mask
  else embedded = ops::embedding(token_table_, tokens);
  const int64_t N = embedded.dim(1);
  CAST_CHECK(N <= config_.tokens(), "model: sequence of {} tokens exceeds the model's {} (max_len)", N,
             config_.tokens());
  Tensor pos = ops::embedding(position_table_, positions_.narrow0(0, N));  // positions 0..N−1
  Tensor h = ops::add(embedded, pos);                                      // (B, N, D)
  if (config_.cls_pooling) {
    h = ops::concat({ops::expand(cls_, {B, 1, config_.dim}), h}, 1);
    m = ops::concat({Tensor::full({B, 1}, 1.0, mask.dtype(), mask.device()), m}, 1);
  }
  if (train && config_.dropout > 0) {
    h = ops::dropout(h, config_.dropout, config_.seed, rng_offset);
    rng_offset += static_cast<uint64_t>(h.numel());
  }
  for (auto& block : blocks_) h = block->forward(h, m, train, rng_offset);
  h = final_norm_.forward(h);
  if (config_.cls_pooling) return ops::reshape(ops::split(h, {1, N}, 1)[0], {B, config_.dim});
  return ops::masked_mean(h, m);
}

Tensor Transformer::forward(const Batch& batch, bool train) {
  Tensor features = encode(batch.tokens, batch.mask, train);
  if (config_.dual) {
    CAST_CHECK(batch.tokens2.defined(), "model: a dual encoder needs the second text of each pair");
    Tensor e2 = encode(batch.tokens2, batch.mask2, train);
    features = ops::concat({features, e2, ops::mul(features, e2), ops::sub(features, e2)}, 1);
  }
  return head2_.forward(ops::relu(head1_.forward(features)));
}

void Transformer::collect_parameters(ParamList& out, const std::string& prefix) {
  if (config_.patch > 1) patch_embedding_.collect_parameters(out, join_name(prefix, "patch_embedding"));
  else out.push_back({join_name(prefix, "token_embedding"), &token_table_});
  if (config_.learned_positions) out.push_back({join_name(prefix, "position_embedding"), &position_table_});
  if (config_.cls_pooling) out.push_back({join_name(prefix, "cls"), &cls_});
  for (size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->collect_parameters(out, join_name(prefix, "blocks." + std::to_string(i)));
  final_norm_.collect_parameters(out, join_name(prefix, "final_norm"));
  head1_.collect_parameters(out, join_name(prefix, "head.dense1"));
  head2_.collect_parameters(out, join_name(prefix, "head.dense2"));
}

std::vector<uint64_t> Transformer::clustering_draws() const {
  std::vector<uint64_t> draws;
  for (const auto& block : blocks_) draws.push_back(block->attention->clustering_draws());
  return draws;
}

void Transformer::set_clustering_draws(const std::vector<uint64_t>& draws) {
  CAST_CHECK(draws.size() == blocks_.size(), "clustering draws for {} layers, but the model has {}", draws.size(),
             blocks_.size());
  for (size_t i = 0; i < draws.size(); ++i) blocks_[i]->attention->set_clustering_draws(draws[i]);
}

}  // namespace cast::nn
