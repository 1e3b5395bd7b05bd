#pragma once
// Memory a command will need, estimated from its sizes before anything is allocated, so that a
// run too big for the machine stops with a clear line instead of being killed by the kernel's
// out-of-memory killer. An estimate errs high: what the forward keeps for the backward, the
// same again for the gradients flowing back, and parameters with gradients and AdamW moments.
// `cast bench` prints it beside the measured peak: on the CPU the peaks measured sit at 0.4 to
// 1.0 times it (0.4 for the step-by-step reference ops, whose N x N temporaries die early).
#include <cstdint>
#include <string>

#include "nn/transformer.h"
#include "tensor/dtype.h"

namespace cast::train {

// One attention layer's forward and backward: B sequences of N tokens of width D. `kept` lives
// from the layer's forward to its backward; `transient` only during its backward (an op that
// forms its forward again there), so a model's layers pay it once, not once each.
struct LayerBytes {
  double kept = 0, transient = 0;
  double total() const { return kept + transient; }
};
LayerBytes attention_layer_parts(const nn::AttentionConfig& a, int64_t B, int64_t N, int64_t D, bool gpu);
double attention_layer_bytes(const nn::AttentionConfig& a, int64_t B, int64_t N, int64_t D, bool gpu);
// One training step of the model on a batch of B sequences of N tokens (f32), by part.
struct StepBytes {
  double parameters = 0;   // the weights, their gradients and AdamW moments
  double activations = 0;  // what the layers keep for the backward, attention's share excluded
  double attention = 0;    // what the attention layers keep
  std::string attention_options;  // the mechanism's options that size its part ("" for full attention)
  bool recompute = false;         // each block keeps its input alone (nn::ModelConfig::recompute)
  double total() const { return parameters + activations + attention; }
  // The largest part and the settings that size it, for a refusal's advice.
  std::string largest() const;
};
StepBytes training_step_parts(const nn::ModelConfig& m, int64_t B, int64_t N, bool gpu);
double training_step_bytes(const nn::ModelConfig& m, int64_t B, int64_t N, bool gpu);
// Throws a one-line Error when `bytes` exceed the memory of `device` (the host's, or the GPU's).
// `what` names the work, `hint` says which settings make it smaller.
void require_memory(double bytes, Device device, const std::string& what, const std::string& hint);
// Refuses (naming `what`) where an address-space limit (ulimit -v) leaves no room for the BLAS's
// work buffers, which it would retry to map without end at its first product: for the commands
// whose work the memory estimate does not size (eval, clusters, bench gemm, demo).
void require_blas_room(const std::string& what);

}  // namespace cast::train
