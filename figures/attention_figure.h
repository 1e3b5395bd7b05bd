#pragma once
// `cast attention`'s figure: where a few queries of one input put their attention weight under
// full attention and under the approximations that reuse its weights (the clustered-attention
// paper's comparison of attention distributions). One row per query, one panel per mechanism;
// each panel lays the keys out as the input's grid (an image's patches, or a sequence wrapped
// into rows) and shades each key by its weight.
#include <cstdint>
#include <string>
#include <vector>

namespace cast::train {

struct AttentionPanels {
  std::vector<std::string> mechanisms;                 // panel titles, left to right
  std::vector<int64_t> queries;                        // token positions (CLS excluded)
  std::vector<std::vector<std::vector<double>>> rows;  // [mechanism][query] -> each key's weight
  std::vector<std::vector<double>> moved;              // [mechanism][query]: weight moved from the first panel's
  int64_t columns = 32;                                // keys per grid row
  std::string title, note;
};

std::string attention_svg(const AttentionPanels& panels);

// Half the L1 distance of two distributions: the weight that would have to move.
double total_variation(const std::vector<double>& p, const std::vector<double>& q);

}  // namespace cast::train
