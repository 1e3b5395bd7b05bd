#pragma once
// One optimisation step (forward, loss, backward, gradient clipping, AdamW) whose statistics
// stay on the model's device. On a GPU a step copies nothing to the host: the loss, the squared
// gradient norm and the number of correct predictions of each step go into a small device
// buffer, and the host reads the buffer (one copy) only when it logs, evaluates or saves.
#include <cstdint>
#include <string>
#include <vector>

#include "nn/transformer.h"
#include "train/adamw.h"

namespace cast::train {

// What the host learns about one step when it reads the buffer.
struct StepRecord {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, correct = 0;
  double examples = 0, tokens = 0;  // known to the host when it built the batch
};

// Whether AdamW's weight decay applies to a parameter: to matrices only, not to biases, norms or
// the CLS vector (its shape is (1, 1, D), so its name says what it is).
bool decayed(const std::string& name, const Tensor& p);

class TrainingStep {
 public:
  // m, v: the AdamW moments, one per parameter of `params`; capacity: the most steps between
  // two reads (one more `compute` before a `read` is an error).
  TrainingStep(nn::Transformer& model, nn::ParamList params, std::vector<Tensor>& m, std::vector<Tensor>& v,
               int64_t capacity);

  // Forward, loss and backward of step `step`; the statistics are recorded on the device.
  void compute(const nn::Batch& batch, int64_t step);
  // Clips the gradients (clip > 0) and applies AdamW; weight decay only to matrices.
  void update(train::AdamWStep s, double weight_decay, double clip);

  int64_t pending() const { return static_cast<int64_t>(records_.size()); }
  // The records of the steps since the last read, in step order: one copy from the device.
  std::vector<StepRecord> read();

 private:
  nn::Transformer& model_;
  nn::ParamList params_;
  std::vector<Tensor>& m_;
  std::vector<Tensor>& v_;
  Tensor buffer_;                    // (3, capacity, 1): loss, squared gradient norm, correct
  std::vector<StepRecord> records_;  // host halves of the pending records
  Tensor squared_norm_;              // (1) of the last compute, for update's clipping
  double host_squared_norm_ = 0;     // the same in double, for parameters on the host
};

}  // namespace cast::train
