#pragma once
// The LRA Transformer encoder: token embedding (or, for images, a linear embedding of each
// patch of pixels) + positions, pre-LayerNorm blocks
// (LN -> attention -> dropout -> residual; LN -> MLP (GELU) -> dropout -> residual), a final
// LayerNorm, CLS or mean pooling (padding excluded), and a classifier head
// (Dense -> ReLU -> Dense). The dual encoder (Retrieval) runs one encoder on both texts and
// classifies [e1, e2, e1·e2, e1 − e2].
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "nn/attention.h"
#include "nn/layers.h"

namespace cast::nn {

struct ModelConfig {
  int64_t vocab = 16;    // token ids in [0, vocab)
  int64_t max_len = 64;  // longest input sequence (CLS excluded); of pixels under `patch`
  // Images: each patch × patch block of pixels is one token, its grey levels (/ 255) embedded
  // by a Linear layer, as in ViT. 1: every pixel a token, its grey level a token id.
  int64_t patch = 1;
  int64_t dim = 64, heads = 4, mlp_dim = 128, layers = 2, classes = 10;
  bool learned_positions = false;  // else fixed sinusoidal
  bool cls_pooling = true;         // else mean over real tokens
  bool dual = false;               // two-tower Retrieval model
  double dropout = 0.1;
  AttentionConfig attention;  // mechanism and its options; dim, heads filled from above
  uint64_t seed = 0;
  // How the model runs, not what it is (so never stored with it): each block keeps only its
  // input from the forward to the backward and runs again in its backward (`--recompute`, a
  // setting of the run: train::TrainConfig::recompute).
  bool recompute = false;

  nlohmann::json to_json() const;  // the fields by their C++ names (files: train/settings.h)
  int64_t tokens() const { return max_len / (patch * patch); }  // longest sequence the blocks see
  // The cluster count of a clustering mechanism's layers: the setting, or where it is 0 the
  // default for the blocks' longest sequence (the CLS token with it); 0 for full attention.
  int64_t cluster_count() const;
};

struct Batch {
  Tensor tokens, mask;    // (B, N) i32 and (B, N) float, 1 = real token
  Tensor tokens2, mask2;  // second text of a dual model
  Tensor labels;          // (B) i32
  // What the host knew when it built the batch, so that statistics need no copy back.
  std::vector<int32_t> host_labels;
  int64_t real_tokens = 0;
};

class Block : public Module {
 public:
  Block(const ModelConfig& c, int index, Initializer& init);
  Tensor forward(const Tensor& x, const Tensor& mask, bool train, uint64_t& rng);
  void collect_parameters(ParamList& out, const std::string& prefix) override;
  LayerNorm norm1, norm2;
  std::unique_ptr<Attention> attention;
  Mlp mlp;
  double dropout;
  uint64_t seed;
  AttentionOutput last;  // the last forward's cluster indices, for `cast clusters`
  // For `cast attention`: when set, forward keeps its attention's input and mask (the CLS's
  // included) in these two fields.
  bool keep_attention_input = false;
  Tensor attention_input, attention_mask;
  bool recompute = false;  // ModelConfig::recompute
  bool fused = true;       // AttentionConfig::fused: a residual's dropout as one op (ops::dropout_add)

 private:
  Tensor run(const Tensor& x, const Tensor& mask, bool train, uint64_t& rng);
};

// A batch of square images' pixels in patch order: (B, side²) raster -> (B, (side / patch)², patch²),
// the patches in raster order, each one's pixels in raster order.
Tensor patch_major(const Tensor& x, int64_t side, int64_t patch);

class Transformer : public Module {
 public:
  Transformer(const ModelConfig& config, DType dtype = DType::f32, Device device = Device::cpu);
  // logits (B, classes). `train` turns dropout on; the dropout stream advances `rng_offset`.
  Tensor forward(const Batch& batch, bool train);
  void collect_parameters(ParamList& out, const std::string& prefix) override;
  const ModelConfig& config() const { return config_; }
  std::vector<std::unique_ptr<Block>>& blocks() { return blocks_; }
  uint64_t rng_offset = 0;
  // Each layer's attention draw count (Attention::clustering_draws), first layer first.
  std::vector<uint64_t> clustering_draws() const;
  void set_clustering_draws(const std::vector<uint64_t>& draws);

 private:
  Tensor encode(const Tensor& tokens, const Tensor& mask, bool train);
  // (B, side²) raster-order grey levels -> (B, (side / patch)², D); the mask likewise to (B, n).
  Tensor embed_patches(const Tensor& pixels, const Tensor& mask, Tensor& patch_mask) const;
  ModelConfig config_;
  Tensor token_table_, position_table_, cls_;
  Linear patch_embedding_;  // (patch², D), used instead of token_table_ when patch > 1
  Tensor grey_levels_;      // (vocab, 1): a constant that turns pixel values into numbers
  Tensor positions_;        // 0 .. tokens() − 1 (i32) where the model is
  std::vector<std::unique_ptr<Block>> blocks_;
  LayerNorm final_norm_;
  Linear head1_, head2_;
};

}  // namespace cast::nn
