// SVG figures of training runs: two panels (loss; accuracy) with axes, ticks, labels, legend.
#include "figures/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "tensor/error.h"
#include "tensor/files.h"
#include "tensor/safetensors.h"
#include "tensor/text.h"

namespace cast::train {

std::string svg_open(int width, int height, bool crisp) {
  // the mark: what another cast figure may replace (files::check_may_replace); the digest: that
  // nobody changed it since
  return fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
                     R"(font-family="DejaVu Sans, Arial, sans-serif"{2}>)"
                     "\n{3}\n<!-- {4} -->\n"
                     R"(<rect width="100%" height="100%" fill="white"/>)"
                     "\n",
                     width, height, crisp ? R"( shape-rendering="crispEdges")" : "", files::kFigureMark,
                     files::kDigestSlot);
}

// Text for an SVG (XML 1.0): the five markup characters escaped, and a control character or a
// byte that is not UTF-8 (a run folder named with one, a --title) shown as U+FFFD, which XML
// does not allow even as a reference.
std::string xml_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const size_t n = text::utf8_length(s, i);
    if (n == 0 || (n == 1 && static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out.append(s, i, n);
    i += n;
  }
  return out;
}

namespace {

std::string hex(const uint8_t rgb[3]) { return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]); }

// 1, 2 or 5 times a power of ten: about `target` intervals over [lo, hi]
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(target, 1);
  if (!(raw > 0) || !std::isfinite(raw)) return 1.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

std::string tick_label(double v, double step) {
  if (std::abs(v) >= 1e7) return fmt::format("{:.3g}", v);  // 2e+18, not 2e+15k
  if (std::abs(v) >= 10000 && step >= 1000) return fmt::format("{:g}k", v / 1000);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step)));
  if (decimals > 6) return v == 0 ? "0" : fmt::format("{:.3g}", v);  // 2e-21, not twenty zeros
  return fmt::format("{:.{}f}", v, decimals);
}

// The ticks from `first` to `last`, `step` apart: counted, not summed until past `last` (a
// step of 1e-21 against a slack of 1e-9 ran for ever), and never more than 100.
std::vector<double> ticks(double first, double last, double step) {
  std::vector<double> out;
  for (int i = 0; i <= 100; ++i) {
    const double t = first + i * step;
    if (t > last + step * 1e-6) break;
    out.push_back(t);
  }
  return out;
}

struct Series {
  std::string label;
  std::vector<double> xs, ys;
  std::string colour;
  bool dashed = false;
};

// One panel at (x0, y0) of size (w, h) in the SVG being built.
// unit_interval: accuracies, shown in percent, from 0 to 100% or, with `zoom` (comparisons,
// where curves lie close together), over the tenths of the range the data spans.
void panel(std::string& svg, double x0, double y0, double w, double h, const std::string& title,
           const std::string& y_label, const std::vector<Series>& series, bool unit_interval, bool zoom = false,
           const std::string& x_label = "training step") {
  double xmin = 0, xmax = 1, ymin = 0, ymax = unit_interval ? 1.0 : 0.0;
  double lowest = 1.0, highest = 0.0;
  bool any = false;
  for (const Series& s : series)
    for (size_t i = 0; i < s.xs.size(); ++i) {
      if (!std::isfinite(s.ys[i])) continue;
      xmax = any ? std::max(xmax, s.xs[i]) : std::max(1.0, s.xs[i]);
      if (!unit_interval) ymax = std::max(ymax, s.ys[i]);
      lowest = std::min(lowest, s.ys[i]);
      highest = std::max(highest, s.ys[i]);
      any = true;
    }
  if (!unit_interval) ymax = ymax > 0 ? ymax * 1.05 : 1.0;
  if (unit_interval && zoom && any) {
    ymin = std::clamp(std::floor((lowest - 0.02) * 10) / 10, 0.0, 0.9);
    ymax = std::clamp(std::ceil((highest + 0.02) * 10) / 10, ymin + 0.1, 1.0);
  }
  auto px = [&](double x) { return x0 + w * (x - xmin) / (xmax - xmin); };
  auto py = [&](double y) { return y0 + h - h * std::clamp((y - ymin) / (ymax - ymin), 0.0, 1.0); };
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="15" font-weight="bold" text-anchor="middle">{}</text>)"
                     "\n",
                     x0 + w / 2, y0 - 12, xml_escape(title));
  // grid, ticks and tick values
  const double xs = nice_step(xmin, xmax, 6), ys = nice_step(ymin, ymax, 5);
  for (double t : ticks(0, xmax, xs)) {
    svg += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#e4e4e4"/>)"
                       R"(<text x="{0:.1f}" y="{3:.1f}" font-size="12" text-anchor="middle">{4}</text>)"
                       "\n",
                       px(t), y0, y0 + h, y0 + h + 16, tick_label(t, xs));
  }
  double first_tick = std::ceil(ymin / ys - 1e-9) * ys;
  if (first_tick == 0) first_tick = 0;  // never "-0.0"
  for (double t : ticks(first_tick, ymax, ys)) {
    svg += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}" stroke="#e4e4e4"/>)"
                       R"(<text x="{3:.1f}" y="{4:.1f}" font-size="12" text-anchor="end">{5}</text>)"
                       "\n",
                       x0, py(t), x0 + w, x0 - 6, py(t) + 4,
                       unit_interval ? fmt::format("{:.0f}%", 100 * t) : tick_label(t, ys));
  }
  svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#333"/>)"
                     "\n",
                     x0, y0, w, h);
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="13" text-anchor="middle">{}</text>)"
                     "\n",
                     x0 + w / 2, y0 + h + 36, xml_escape(x_label));
  svg += fmt::format(
      R"(<text transform='translate({:.1f},{:.1f}) rotate(-90)' font-size="13" text-anchor="middle">{}</text>)"
      "\n",
      x0 - 46, y0 + h / 2, xml_escape(y_label));
  if (!any) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="13" text-anchor="middle" fill="#888">no data</text>)"
                       "\n",
                       x0 + w / 2, y0 + h / 2);
    return;
  }
  // the lines (a single point gets a dot)
  for (const Series& s : series) {
    std::string points;
    for (size_t i = 0; i < s.xs.size(); ++i)
      if (std::isfinite(s.ys[i])) points += fmt::format("{:.1f},{:.1f} ", px(s.xs[i]), py(s.ys[i]));
    if (points.empty()) continue;
    svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>)"
                       "\n",
                       points, s.colour, s.dashed ? R"( stroke-dasharray="6,4")" : "");
    if (s.xs.size() <= 12)
      for (size_t i = 0; i < s.xs.size(); ++i)
        if (std::isfinite(s.ys[i]))
          svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)"
                             "\n",
                             px(s.xs[i]), py(s.ys[i]), s.colour);
  }
  // legend inside the panel: top right for losses (they fall), bottom right for accuracies (they rise)
  const double legend_height = 18.0 * series.size() + 8,
               legend_top = unit_interval ? y0 + h - 4 - legend_height : y0 + 4;
  double ly = legend_top + 12;
  const double lx = x0 + w - 200;
  svg += fmt::format(
      R"(<rect x="{:.1f}" y="{:.1f}" width="192" height="{:.1f}" fill="white" fill-opacity="0.85" stroke="#ccc"/>)"
      "\n",
      lx - 6, legend_top, legend_height);
  for (const Series& s : series) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="3"{}/>)"
                       R"(<text x="{:.1f}" y="{:.1f}" font-size="12">{}</text>)"
                       "\n",
                       lx, ly - 4, lx + 24, ly - 4, s.colour, s.dashed ? R"( stroke-dasharray="6,4")" : "", lx + 30, ly,
                       xml_escape(s.label));
    ly += 18;
  }
}

}  // namespace

namespace {

std::string figure(const std::string& title, const std::vector<Series>& left, const std::vector<Series>& right,
                   const std::string& left_title, const std::string& right_title, bool zoom = false) {
  const int width = 1100, height = 440;
  std::string svg =
      svg_open(width, height) +
      fmt::format(R"(<text x="{}" y="26" font-size="18" font-weight="bold" text-anchor="middle">{}</text>)"
                  "\n",
                  width / 2, xml_escape(title));
  panel(svg, 80, 70, 440, 300, left_title, "loss (cross-entropy)", left, false);
  panel(svg, 620, 70, 440, 300, right_title, "accuracy", right, true, zoom);
  return svg + "</svg>\n";
}

}  // namespace

void category_colour(int index, uint8_t rgb[3]) {
  // hues spread by the golden angle, three lightness levels in turn: adjacent indices differ
  // in both, so 32 clusters stay tellable apart
  const double hue = std::fmod(index * 137.508, 360.0) / 60.0;
  const double light[3] = {0.50, 0.33, 0.68}, sat = 0.75;
  const double l = light[index % 3];
  const double c = (1 - std::abs(2 * l - 1)) * sat, x = c * (1 - std::abs(std::fmod(hue, 2.0) - 1)), m = l - c / 2;
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(hue)) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x;
  }
  rgb[0] = static_cast<uint8_t>(std::lround(255 * (r + m)));
  rgb[1] = static_cast<uint8_t>(std::lround(255 * (g + m)));
  rgb[2] = static_cast<uint8_t>(std::lround(255 * (b + m)));
}

namespace {

// The largest loss, rate or speed a metrics line may hold: far beyond any a run writes, and
// small enough that a figure's axis (5% above it) stays finite.
constexpr double kLargestValue = 1e300;

struct MetricsLine {
  std::string split;
  int64_t step = 0;  // exact: two steps near 2^63 are one double
  double loss = 0, accuracy = 0;
  bool final = false;  // a final evaluation's record beside the run's own of that step
  std::string run;     // the id of the run that wrote it; "" in records written before it was kept
};

// One metrics.jsonl line, checked key by key: the keys the trainer writes for its split, each of
// its type and range, and no other.
MetricsLine parse_metrics_line(const std::string& line, const std::string& where) {
  const nlohmann::json j = files::parse_json(line, where);
  CAST_CHECK(j.is_object(), "{}: not a JSON object", where);
  auto number = [&](const char* key, double lo, double hi) {
    CAST_CHECK(j.contains(key), "{}: '{}' is missing", where, key);
    CAST_CHECK(j[key].is_number(), "{}: '{}' is {}, not a number", where, key, files::json_excerpt(j[key]));
    const double v = j[key].get<double>();
    CAST_CHECK(std::isfinite(v) && v >= lo && v <= hi, "{}: '{}' is {}, outside [{}, {}]", where, key, v, lo, hi);
    return v;
  };
  MetricsLine m;
  CAST_CHECK(j.contains("split") && j["split"].is_string(), "{}: 'split' is missing or not a string", where);
  m.split = j["split"].get<std::string>();
  CAST_CHECK(m.split == "train" || m.split == "val" || m.split == "test", "{}: 'split' is '{}', not train, val or test",
             where, m.split);
  const std::set<std::string> keys =
      m.split == "train" ? std::set<std::string>{"step", "split", "loss", "accuracy", "lr", "tokens_per_s", "run"}
                         : std::set<std::string>{"step", "split", "loss", "accuracy", "final", "run"};
  for (const auto& [key, value] : j.items())
    CAST_CHECK(keys.count(key), "{}: '{}' is no key of a {} record (cast train writes {})", where, visible(key),
               m.split, fmt::join(keys, ", "));
  CAST_CHECK(!j.contains("step") || !j["step"].is_number_unsigned() ||
                 j["step"].get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
             "{}: 'step' is {}: out of range (at most {})", where, files::json_excerpt(j["step"]), INT64_MAX);
  CAST_CHECK(j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() >= 0,
             "{}: 'step' is {}, not an integer 0 or more written as one (digits alone)", where,
             files::json_excerpt(j.value("step", nlohmann::json())));
  m.step = j["step"].get<int64_t>();
  m.accuracy = number("accuracy", 0, 1);
  // any finite value a run may write: a diverging run's loss, a learning rate the settings took
  if (m.split == "train" || j.contains("loss")) m.loss = number("loss", 0, kLargestValue);
  for (const char* key : {"lr", "tokens_per_s"})  // files written before these keys lack them
    if (j.contains(key)) number(key, 0, kLargestValue);
  // the id of the run that wrote it (records written before it was kept lack it)
  CAST_CHECK(!j.contains("run") || (j["run"].is_string() && text::is_run_id(j["run"].get<std::string>())),
             "{}: 'run' is {}, not a run id (16 lowercase hexadecimal digits)", where, files::json_excerpt(j["run"]));
  if (j.contains("run")) m.run = j["run"].get<std::string>();
  if (j.contains("final")) {
    CAST_CHECK(j["final"] == true, "{}: 'final' is {}, not true", where, files::json_excerpt(j["final"]));
    m.final = true;
  }
  return m;
}

}  // namespace

Curves read_curves(const std::string& run_dir) {
  std::string label = std::filesystem::path(run_dir).filename().string();
  if (label.empty()) label = std::filesystem::path(run_dir).parent_path().filename().string();
  files::require_folder(run_dir, "run folder");
  const std::string path = run_dir + "/metrics.jsonl";
  return curves_of_metrics(files::read_file(path, "metrics file"), path, label);
}

Curves curves_of_metrics(const std::string& text, const std::string& path, const std::string& label) {
  Curves c;
  c.label = label;
  std::istringstream in(text);
  int line_no = 0;
  int64_t last_train = -1, last_val = -1;
  std::string run;  // the first record's run id, and its line
  int run_line = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const std::string where = fmt::format("metrics file {}:{}", path, line_no);
    const MetricsLine m = parse_metrics_line(line, where);
    // one run's records (a branch's history is given the branch's id as it is copied)
    if (!m.run.empty() && run.empty()) run = m.run, run_line = line_no;
    CAST_CHECK(m.run.empty() || m.run == run, "{}: a record of run {}, but line {} is of run {}: two runs' records in one "
               "file", where, m.run, run_line, run);
    // an older cast's records carry no id, and come before any that do
    CAST_CHECK(!m.run.empty() || run.empty(), "{}: a record with no run id after line {}, a record of run {}: a record "
               "taken out of its run's file, or edited", where, run_line, run);
    // the trainer writes a line per logged step and per validation, in step order; a final
    // evaluation's record of a step the run validated is not drawn (marked "final"; files written
    // before the mark repeat the step unmarked)
    int64_t& last = m.split == "train" ? last_train : last_val;  // -1: none yet
    const bool repeat = m.split == "val" && last >= 0 && m.step == last;
    if (m.split != "test" && !m.final && !repeat) {
      CAST_CHECK(last < 0 || m.step > last, "{}: {} step {} comes after step {}: not in step order", where, m.split,
                 m.step, last);
      last = m.step;
    }
    if (m.split == "train") {
      c.steps.push_back(static_cast<double>(m.step));
      c.loss.push_back(m.loss);
      c.accuracy.push_back(m.accuracy);
    } else if (m.split == "val" && !m.final && !repeat) {
      c.val_steps.push_back(static_cast<double>(m.step));
      c.val_accuracy.push_back(m.accuracy);
    }
  }
  return c;
}

void plot_run(const std::string& svg_path, const std::string& title, const Curves& run, files::Link link) {
  const std::string train = "#1f77b4", val = "#d62728";
  std::vector<Series> left = {{"training loss", run.steps, run.loss, train, false}};
  std::vector<Series> right = {{"training accuracy", run.steps, run.accuracy, train, false},
                               {"validation accuracy", run.val_steps, run.val_accuracy, val, true}};
  files::write_stamped(svg_path, figure(title, left, right, "Training loss", "Accuracy"), "figure", link);
}

void plot_comparison(const std::string& svg_path, const std::string& title, const std::vector<Curves>& runs,
                     files::Link link) {
  std::vector<Series> left, right;
  for (size_t i = 0; i < runs.size(); ++i) {
    uint8_t rgb[3];
    category_colour(static_cast<int>(i), rgb);
    left.push_back({runs[i].label, runs[i].steps, runs[i].loss, hex(rgb), false});
    right.push_back({runs[i].label, runs[i].val_steps, runs[i].val_accuracy, hex(rgb), false});
  }
  files::write_stamped(svg_path, figure(title, left, right, "Training loss", "Validation accuracy", true), "figure",
                      link);
}

void plot_lines(const std::string& svg_path, const std::string& title, const std::string& x_label,
                const std::vector<Line>& lines) {
  std::vector<Series> series;
  for (size_t i = 0; i < lines.size(); ++i) {
    CAST_CHECK(lines[i].xs.size() == lines[i].ys.size(), "plot: line '{}' has {} x and {} y values", lines[i].label,
               lines[i].xs.size(), lines[i].ys.size());
    uint8_t rgb[3];
    category_colour(static_cast<int>(i), rgb);
    series.push_back({lines[i].label, lines[i].xs, lines[i].ys, hex(rgb), lines[i].dashed});
  }
  const int width = 640, height = 440;
  std::string svg = svg_open(width, height);
  panel(svg, 80, 60, 520, 310, title, "accuracy", series, true, true, x_label);
  files::write_stamped(svg_path, svg + "</svg>\n", "figure");
}

}  // namespace cast::train
