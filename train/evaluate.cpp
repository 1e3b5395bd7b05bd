#include "train/evaluate.h"

#include <numeric>

#include "autograd/tape.h"
#include "ops/ops.h"
#include "train/stop.h"

namespace cast::train {

EvalResult evaluate(nn::Transformer& model, const data::TaskData& task, const std::vector<data::Example>& split,
                    int64_t batch, int64_t limit, Device device) {
  autograd::NoGradGuard no_grad;
  EvalResult r;
  const int64_t n = limit > 0 ? std::min<int64_t>(limit, split.size()) : static_cast<int64_t>(split.size());
  double loss_sum = 0, correct = 0;
  for (int64_t start = 0; start < n; start += batch) {
    if (const int signal = stop_signal()) throw EvaluationStopped(signal);  // Ctrl-C, SIGTERM: between batches
    std::vector<int64_t> idx(std::min(batch, n - start));
    std::iota(idx.begin(), idx.end(), start);
    nn::Batch b = data::make_batch(task, split, idx, DType::f32, device);
    Tensor logits = model.forward(b, false);
    loss_sum += ops::cross_entropy(logits, b.labels).item() * static_cast<double>(idx.size());
    Tensor predicted = ops::topk(logits, 1);
    auto p = predicted.to_double_vector(), y = b.labels.to_double_vector();
    for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
  }
  r.examples = n;
  r.majority = data::majority_rate(split, task.classes, n);
  r.loss = n ? loss_sum / n : 0;
  r.accuracy = n ? correct / n : 0;
  return r;
}

}  // namespace cast::train
