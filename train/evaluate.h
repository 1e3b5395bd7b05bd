#pragma once
// Evaluation: the loss and accuracy of a model on a split, in batches, without a tape.
#include <cstdint>
#include <vector>

#include "nn/transformer.h"
#include "datasets/data.h"

namespace cast::train {

struct EvalResult {
  double loss = 0, accuracy = 0;
  double majority = 0;  // the commonest label's share among exactly the examples evaluated
  int64_t examples = 0;
};

// `limit` > 0: the first `limit` examples of the split only. A stop request (train/stop.h) ends it
// between batches with EvaluationStopped.
EvalResult evaluate(nn::Transformer& model, const data::TaskData& task, const std::vector<data::Example>& split,
                    int64_t batch, int64_t limit, Device device);

}  // namespace cast::train
