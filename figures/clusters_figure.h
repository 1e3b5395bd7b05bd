#pragma once
// `cast clusters`'s figure: a CAST model's clusters over one image input, as SVG. A column of
// labels, then per layer (row) the input and one panel per head, each image pixel a square
// coloured by its cluster; a legend of the clusters; what black means.
#include <cstdint>
#include <string>
#include <vector>

#include "nn/transformer.h"

namespace cast::train {

struct ClustersFigure {
  std::vector<int32_t> pixels;  // the input image, side × side grey levels
  int side = 0;                 // the image's side in pixels
  int scale = 4;                // figure pixels per image pixel
  int64_t index = 0;            // which test example
  std::string source;           // the checkpoint, named in the figure
};

// `model` has just run forward on the image (its blocks hold their last clusters).
std::string clusters_svg(nn::Transformer& model, const ClustersFigure& figure);

}  // namespace cast::train
