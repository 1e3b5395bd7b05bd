#include "train/training_step.h"

#include <cmath>

#include "autograd/tape.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/ops.h"

namespace cast::train {

TrainingStep::TrainingStep(nn::Transformer& model, nn::ParamList params, std::vector<Tensor>& m, std::vector<Tensor>& v,
                           int64_t capacity)
    : model_(model), params_(std::move(params)), m_(m), v_(v) {
  CAST_CHECK(capacity >= 1, "training step: capacity must be >= 1, got {}", capacity);
  CAST_CHECK(m_.size() == params_.size() && v_.size() == params_.size(),
             "training step: {} parameters but {} and {} moments", params_.size(), m_.size(), v_.size());
  const Tensor& first = *params_.at(0).second;
  buffer_ = Tensor::zeros({3, capacity, 1}, first.dtype(), first.device());
}

void TrainingStep::compute(const nn::Batch& batch, int64_t step) {
  CAST_CHECK(pending() < buffer_.dim(1),
             "training step: {} steps computed since the last read, the most the buffer "
             "holds; read() first",
             pending());
  Tensor logits = model_.forward(batch, true);
  Tensor loss = ops::cross_entropy(logits, batch.labels);
  autograd::backward(loss);
  // ‖g‖² summed where the gradients are: on a GPU one value, not one copy per parameter; on the
  // host in double, as it always was
  squared_norm_ = Tensor();
  host_squared_norm_ = 0;
  for (auto& [name, t] : params_) {
    if (!t->grad().defined()) continue;
    Tensor square = ops::sum_all(ops::mul(t->grad(), t->grad()));
    if (!square.is_cuda()) host_squared_norm_ += square.item();
    else squared_norm_ = squared_norm_.defined() ? ops::add(squared_norm_, square) : square;
  }
  if (!squared_norm_.defined()) squared_norm_ = Tensor::full({1}, host_squared_norm_, loss.dtype(), loss.device());
  const int64_t row = pending();
  buffer_.slice0(0).slice0(row).copy_from(loss.view({1}));
  buffer_.slice0(1).slice0(row).copy_from(squared_norm_.view({1}));
  buffer_.slice0(2).slice0(row).copy_from(ops::correct_predictions(logits, batch.labels));
  StepRecord r;
  r.step = step;
  r.examples = static_cast<double>(batch.host_labels.size());
  // the tokens the blocks see: under --patch one a patch of pixels (images have no padding)
  const int64_t patch = model_.config().patch;
  r.tokens = static_cast<double>(batch.real_tokens) / static_cast<double>(patch * patch);
  records_.push_back(r);
}

bool decayed(const std::string& name, const Tensor& p) {
  const bool cls = name == "cls" || (name.size() > 4 && name.compare(name.size() - 4, 4, ".cls") == 0);
  return p.ndim() >= 2 && !cls;
}

void TrainingStep::update(train::AdamWStep s, double weight_decay, double clip) {
  CAST_CHECK(squared_norm_.defined(), "training step: update before compute");
  if (clip > 0) {
    if (!squared_norm_.is_cuda()) {  // the host path in double, as it always was
      const double factor = clip_factor_of(host_squared_norm_, clip);
      if (factor != 1.0)
        for (auto& [name, t] : params_)
          if (t->grad().defined()) {
            Tensor g = t->grad();
            ops::affine_forward(g, g, factor, 0.0);
          }
    } else {  // the factor stays on the device: a GPU never waits for the norm
      const Tensor factor = train::clip_factor(squared_norm_, clip);
      for (auto& [name, t] : params_)
        if (t->grad().defined()) {
          Tensor g = t->grad();
          ops::binary_forward(g, BinaryOp::mul, g, factor);
        }
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = *params_[i].second;
    if (!p.grad().defined()) continue;
    s.weight_decay = decayed(params_[i].first, p) ? weight_decay : 0.0;
    train::adamw_update(p, p.grad(), m_[i], v_[i], s);
    p.reset_grad();
  }
  squared_norm_ = Tensor();
}

std::vector<StepRecord> TrainingStep::read() {
  std::vector<StepRecord> out;
  out.swap(records_);
  if (out.empty()) return out;
  const std::vector<double> values = buffer_.to_double_vector();  // the one copy
  const int64_t capacity = buffer_.dim(1);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].loss = values[i];
    out[i].grad_norm = std::sqrt(values[capacity + i]);
    out[i].correct = values[2 * capacity + i];
  }
  return out;
}

}  // namespace cast::train
