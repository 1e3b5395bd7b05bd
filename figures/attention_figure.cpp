#include "figures/attention_figure.h"

#include <algorithm>
#include <cmath>

#include "tensor/error.h"
#include "figures/plot.h"

namespace cast::train {

double total_variation(const std::vector<double>& p, const std::vector<double>& q) {
  CAST_CHECK(p.size() == q.size(), "total variation: {} and {} keys", p.size(), q.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += std::abs(p[i] - q[i]);
  return sum / 2;
}

std::string attention_svg(const AttentionPanels& a) {
  const int64_t M = static_cast<int64_t>(a.mechanisms.size()), Q = static_cast<int64_t>(a.queries.size());
  CAST_CHECK(M > 0 && Q > 0 && static_cast<int64_t>(a.rows.size()) == M && static_cast<int64_t>(a.moved.size()) == M,
             "attention figure: {} panels of {} queries", M, Q);
  const int64_t keys = static_cast<int64_t>(a.rows[0][0].size()), cols = std::max<int64_t>(1, a.columns);
  const int64_t grid_rows = (keys + cols - 1) / cols;
  const int cell = static_cast<int>(std::clamp<int64_t>(220 / cols, 3, 24));
  const int panel_w = static_cast<int>(cols) * cell, panel_h = static_cast<int>(grid_rows) * cell;
  const int left = 90, top = 64, gap = 18;
  const int width = std::max(left + static_cast<int>(M) * (panel_w + gap) + 10, 600);
  const int height = top + static_cast<int>(Q) * (panel_h + gap + 16) + 50;
  std::string svg =
      svg_open(width, height, true) + fmt::format(R"(<text x="10" y="22" font-size="15" font-weight="bold">{}</text>)"
                                                  "\n",
                                                  xml_escape(a.title));
  for (int64_t m = 0; m < M; ++m)
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="middle">{}</text>)"
                       "\n",
                       left + m * (panel_w + gap) + panel_w / 2, top - 10, xml_escape(a.mechanisms[m]));
  for (int64_t qi = 0; qi < Q; ++qi) {
    const int y0 = top + static_cast<int>(qi) * (panel_h + gap + 16);
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="end">query {}</text>)"
                       "\n",
                       left - 10, y0 + panel_h / 2 + 4, a.queries[qi]);
    double most = 1e-12;  // one scale per query, so that its panels compare
    for (int64_t m = 0; m < M; ++m)
      for (double w : a.rows[m][qi]) most = std::max(most, w);
    for (int64_t m = 0; m < M; ++m) {
      const int x0 = left + static_cast<int>(m) * (panel_w + gap);
      const auto& row = a.rows[m][qi];
      for (int64_t key = 0; key < keys; ++key) {
        const double shade = std::clamp(row[key] / most, 0.0, 1.0);
        const int level = static_cast<int>(std::lround(255 * (1 - shade)));
        svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="#{:02x}{:02x}ff"/>)",
                           x0 + (key % cols) * cell, y0 + (key / cols) * cell, cell, cell, level, level);
      }
      const int64_t q = a.queries[qi];  // the query itself: a red frame
      svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#d00" stroke-width="1.5"/>)",
                         x0 + (q % cols) * cell, y0 + (q / cols) * cell, cell, cell);
      svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>)"
                         "\n",
                         x0, y0, panel_w, panel_h);
      if (m > 0)
        svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" fill="#555">{:.3f} of the weight moved</text>)"
                           "\n",
                           x0, y0 + panel_h + 13, a.moved[m][qi]);
    }
  }
  svg += fmt::format(R"(<text x="10" y="{}" font-size="12" fill="#555">{}</text>)"
                     "\n</svg>\n",
                     height - 16, xml_escape(a.note));
  return svg;
}

}  // namespace cast::train
