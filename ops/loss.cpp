#include "ops/loss.h"

#include <cmath>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "math/topk_order.h"
#include "ops/rows.h"
#include "ops/softmax.h"
#ifdef CAST_WITH_CUDA
#include "cuda/loss.h"
#endif

namespace cast::ops {

// logits (R, C) float and labels (R) ints on one device.
static void check_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  check_float(op, logits, "logits");
  check_ndim(op, logits, 2, "logits");
  check_index(op, labels, "labels");
  check_same_device(op, logits, labels);
  CAST_CHECK(labels.shape() == Shape{logits.dim(0)}, "{}: labels {} must be [{}] for logits {}", op, labels.describe(),
             logits.dim(0), logits.describe());
}

void cross_entropy_forward(Tensor& loss, Tensor& logp, Tensor& count, const Tensor& logits, const Tensor& labels) {
  check_logits_and_labels("cross_entropy", logits, labels);
  check_index_range("cross_entropy", labels, -1, logits.dim(1));
  softmax_forward(logp, logits, Tensor(), /*log=*/true);
  const int64_t rows = logits.dim(0), classes = logits.dim(1);
  CAST_ON_CUDA(logits, cuda::cross_entropy_forward(loss, count, logp, labels, rows, classes));
  CAST_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    CAST_DISPATCH_INDEX(labels.dtype(), "cross_entropy", [&] {
      T total = 0;
      int64_t labelled = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const I y = labels.data<I>()[r];
        if (y < 0) continue;
        total -= logp.data<T>()[r * classes + y];
        ++labelled;
      }
      loss.data<T>()[0] = labelled ? total / static_cast<T>(labelled) : T(0);
      count.data<T>()[0] = static_cast<T>(labelled);
    });
  });
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            const Tensor& count) {
  const int64_t rows = logp.dim(0), classes = logp.dim(1);
  CAST_ON_CUDA(logp, cuda::cross_entropy_backward(dlogits, dloss, logp, labels, count, rows, classes));
  CAST_DISPATCH_FLOAT(logp.dtype(), "cross_entropy", [&] {
    CAST_DISPATCH_INDEX(labels.dtype(), "cross_entropy", [&] {
      const T labelled = count.data<T>()[0];
      if (labelled == T(0)) return;
      const T g = dloss.data<T>()[0] / labelled;
      for (int64_t r = 0; r < rows; ++r) {
        const I y = labels.data<I>()[r];
        if (y < 0) continue;
        for (int64_t c = 0; c < classes; ++c)
          dlogits.data<T>()[r * classes + c] +=
              g * (std::exp(logp.data<T>()[r * classes + c]) - (c == y ? T(1) : T(0)));
      }
    });
  });
}

struct CrossEntropyNode final : autograd::Node {
  Tensor logits;  // input: (R, C)
  Tensor labels;  // (R) ints
  Tensor logp;    // saved log-probabilities: (R, C)
  Tensor count;   // (1) labelled rows
  const char* name() const override { return "cross_entropy"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("logits", logits);
    visit.input("labels", labels);
    visit.saved("logp", logp);
    visit.saved("count", count);
  }
  void backward() override {
    Tensor dlogits = logits.grad_accumulator();
    cross_entropy_backward(dlogits, outputs[0].grad(), logp, labels, count);
  }
};

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_float("cross_entropy", logits, "logits");
  Tensor loss = Tensor::empty({1}, logits.dtype(), logits.device());
  Tensor logp = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  Tensor count = Tensor::empty({1}, logits.dtype(), logits.device());
  cross_entropy_forward(loss, logp, count, logits, labels);
  if (autograd::needs_grad({&logits})) {
    auto node = std::make_unique<CrossEntropyNode>();
    node->logits = logits;
    node->labels = labels;
    node->logp = logp;
    node->count = count;
    node->outputs = {loss};
    autograd::record(std::move(node));
  }
  return loss;
}

Tensor correct_predictions(const Tensor& logits, const Tensor& labels) {
  check_logits_and_labels("correct_predictions", logits, labels);
  Tensor correct = Tensor::empty({1}, logits.dtype(), logits.device());
  const int64_t rows = logits.dim(0), classes = logits.dim(1);
  auto count = [&] {
    CAST_ON_CUDA(logits, cuda::correct_predictions(correct, logits, labels, rows, classes));
    CAST_DISPATCH_FLOAT(logits.dtype(), "correct_predictions", [&] {
      CAST_DISPATCH_INDEX(labels.dtype(), "correct_predictions", [&] {
        int64_t hits = 0;
        for (int64_t r = 0; r < rows && classes > 0; ++r) {
          const T* row = logits.data<T>() + r * classes;
          int64_t top = 0;
          for (int64_t c = 1; c < classes; ++c)
            if (ranks_before(row[c], c, row[top], top)) top = c;
          hits += labels.data<I>()[r] == top ? 1 : 0;
        }
        correct.data<T>()[0] = static_cast<T>(hits);
      });
    });
  };
  count();
  return correct;
}

}  // namespace cast::ops
