#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cast::train {
// Two panels, training loss (left) and training accuracy (right), one point per log interval.
void plot_training_curves(const std::string& path, const std::vector<double>& loss, const std::vector<double>& accuracy,
                          int64_t steps_per_point);
}  // namespace cast::train
