// A minimal rasteriser for the loss and accuracy curves: axes, a light grid, a polyline.
#include "train/plot.h"

#include <algorithm>
#include <cmath>

#include "train/png.h"

namespace cast::train {

namespace {

struct Canvas {
  png::Image img;
  Canvas(int w, int h) { img = png::Image{w, h, 3, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, 255)}; }
  void dot(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
    uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
    p[0] = r, p[1] = g, p[2] = b;
  }
  void line(int x0, int y0, int x1, int y1, uint8_t r, uint8_t g, uint8_t b) {
    const int steps = std::max({std::abs(x1 - x0), std::abs(y1 - y0), 1});
    for (int i = 0; i <= steps; ++i) {
      const int x = x0 + (x1 - x0) * i / steps, y = y0 + (y1 - y0) * i / steps;
      dot(x, y, r, g, b);
      dot(x, y + 1, r, g, b);
    }
  }
};

void panel(Canvas& c, int left, int top, int w, int h, const std::vector<double>& ys, double lo, double hi,
           uint8_t r, uint8_t g, uint8_t b) {
  for (int i = 0; i <= 4; ++i) {  // grid
    const int y = top + h * i / 4;
    c.line(left, y, left + w, y, 225, 225, 225);
  }
  c.line(left, top, left, top + h, 0, 0, 0);
  c.line(left, top + h, left + w, top + h, 0, 0, 0);
  if (ys.empty() || hi <= lo) return;
  auto px = [&](size_t i) { return left + static_cast<int>(w * (ys.size() == 1 ? 0.5 : double(i) / (ys.size() - 1))); };
  auto py = [&](double v) { return top + h - static_cast<int>(h * std::clamp((v - lo) / (hi - lo), 0.0, 1.0)); };
  for (size_t i = 1; i < ys.size(); ++i) c.line(px(i - 1), py(ys[i - 1]), px(i), py(ys[i]), r, g, b);
  if (ys.size() == 1) c.line(px(0) - 2, py(ys[0]), px(0) + 2, py(ys[0]), r, g, b);
}

}  // namespace

void plot_training_curves(const std::string& path, const std::vector<double>& loss, const std::vector<double>& accuracy,
                          int64_t) {
  Canvas c(840, 320);
  double hi = 0;
  for (double v : loss)
    if (std::isfinite(v)) hi = std::max(hi, v);
  panel(c, 30, 20, 370, 270, loss, 0.0, hi * 1.05, 200, 40, 40);         // loss from 0 to its maximum
  panel(c, 440, 20, 370, 270, accuracy, 0.0, 1.0, 30, 90, 200);           // accuracy from 0 to 1
  png::write(path, c.img);
}

}  // namespace cast::train
