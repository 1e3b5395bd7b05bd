#include "figures/clusters_figure.h"

#include <algorithm>

#include "figures/cluster_changes.h"
#include "figures/plot.h"

namespace cast::train {

namespace {

// The figure's measures, from the model's shape and the image's.
struct Layout {
  int layers = 0, heads = 0, clusters = 0;
  int side = 0, s = 0;  // image side; figure pixels per image pixel
  int panel = 0, gap = 14, left = 80, top = 60;
  int width = 0, height = 0, legend_cols = 0, legend_rows = 0, legend_top = 0;
  int offset = 0;  // token 0 is CLS under CLS pooling
  int patch = 1;   // a token covers patch x patch pixels
  int kappa = 0;   // tokens per cluster
};

Layout layout(nn::Transformer& model, const ClustersFigure& f) {
  Layout l;
  const nn::ModelConfig& m = model.config();
  l.layers = static_cast<int>(model.blocks().size());
  l.heads = static_cast<int>(m.heads);
  l.clusters = l.layers ? static_cast<int>(model.blocks()[0]->last.clusters.dim(2)) : 0;
  l.kappa = l.layers ? static_cast<int>(model.blocks()[0]->last.clusters.dim(3)) : 0;
  l.offset = m.cls_pooling ? 1 : 0;
  l.side = f.side, l.s = f.scale;
  l.patch = static_cast<int>(m.patch);
  l.panel = l.side * l.s;
  l.width = std::max(l.left + (l.heads + 1) * (l.panel + l.gap) + 10, 940);
  l.legend_cols = std::max(1, (l.width - 40) / 70);
  l.legend_rows = (l.clusters + l.legend_cols - 1) / l.legend_cols;
  l.legend_top = l.top + l.layers * (l.panel + l.gap + 18) + 10;
  l.height = l.legend_top + 22 * l.legend_rows + 74;
  return l;
}

std::string colour(int cluster) {
  uint8_t rgb[3];
  category_colour(cluster, rgb);
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

std::string square(int x, int y, int size, const std::string& fill) {
  return fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>)", x, y, size, size, fill);
}

std::string header(const Layout& l, const nn::AttentionConfig& a, int64_t index) {
  std::string svg =
      svg_open(l.width, l.height, true) +
      fmt::format(
          R"(<text x="10" y="22" font-size="16" font-weight="bold">CAST clusters ({0}): test example {1}, {2} clusters of {3} tokens per head</text>)"
          "\n",
          a.single_assignment ? "Single-Assignment Top-K" : "Top-K", index, l.clusters, l.kappa);
  for (int h = 0; h <= l.heads; ++h)
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="middle">{}</text>)"
                       "\n",
                       l.left + h * (l.panel + l.gap) + l.panel / 2, l.top - 8,
                       h == 0 ? std::string("input") : fmt::format("head {}", h));
  return svg;
}

// One layer's row: the input image, then each head's panel, a pixel coloured by the first
// cluster that holds its token (black: none).
std::string layer_row(const Layout& l, nn::Transformer& model, const ClustersFigure& f, int layer) {
  const int y0 = l.top + layer * (l.panel + l.gap + 18), n = l.side * l.side;
  std::string svg = fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="end">layer {}</text>)"
                                "\n",
                                l.left - 10, y0 + l.panel / 2 + 4, layer + 1);
  for (int p = 0; p < n; ++p)
    svg += square(l.left + (p % l.side) * l.s, y0 + (p / l.side) * l.s, l.s,
                  fmt::format("#{0:02x}{0:02x}{0:02x}", std::clamp(static_cast<int>(f.pixels[p]), 0, 255)));
  const int tokens = n / (l.patch * l.patch);
  const auto owner = first_clusters(model.blocks()[layer]->last.clusters, tokens, l.offset);  // (1, H, tokens)
  const int cells = l.side / l.patch, cell = l.patch * l.s;                                   // one square per token
  for (int h = 0; h < l.heads; ++h) {
    const int x0 = l.left + (h + 1) * (l.panel + l.gap);
    for (int t = 0; t < tokens; ++t) {
      const int o = owner[h * tokens + t];
      svg += square(x0 + (t % cells) * cell, y0 + (t / cells) * cell, cell, o >= 0 ? colour(o) : "#000000");
    }
    svg += "\n";
  }
  return svg;
}

std::string legend(const Layout& l, const std::string& source) {
  std::string svg = fmt::format(R"(<text x="10" y="{}" font-size="13" font-weight="bold">clusters</text>)"
                                "\n",
                                l.legend_top);
  for (int c = 0; c < l.clusters; ++c) {
    const int x = 20 + (c % l.legend_cols) * 70, y = l.legend_top + 10 + (c / l.legend_cols) * 22;
    svg += fmt::format(
        R"(<rect x="{}" y="{}" width="16" height="16" fill="{}" stroke="#555"/><text x="{}" y="{}" font-size="12">{}</text>)"
        "\n",
        x, y, colour(c), x + 22, y + 13, c + 1);
  }
  const int note = l.legend_top + 22 * l.legend_rows + 26;
  svg += fmt::format(
      R"(<text x="10" y="{}" font-size="12">Black: in no cluster. Top-K picks each cluster's tokens independently: )"
      R"(some tokens land in several clusters, others in none;</text>)"
      "\n"
      R"(<text x="10" y="{}" font-size="12">Single-Assignment Top-K places each token at most once and leaves )"
      R"(the last ones out when C·κ &lt; N. In several clusters: the first is shown.</text>)"
      "\n"
      R"(<text x="10" y="{}" font-size="12" fill="#555">{}: {} layers, {} heads.</text>)"
      "\n</svg>\n",
      note, note + 17, note + 36, xml_escape(source), l.layers, l.heads);
  return svg;
}

}  // namespace

std::string clusters_svg(nn::Transformer& model, const ClustersFigure& figure) {
  const Layout l = layout(model, figure);
  std::string svg = header(l, model.config().attention, figure.index);
  for (int layer = 0; layer < l.layers; ++layer) svg += layer_row(l, model, figure, layer);
  return svg + legend(l, figure.source);
}

}  // namespace cast::train
