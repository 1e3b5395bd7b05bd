#pragma once
// Training curves as SVG: text needs no font file, and every browser opens it. A figure has two
// panels, training loss and accuracy (training and validation) against the step, with a
// title, axis labels, tick values and a legend; a comparison puts several runs in the same
// two panels, one colour per run.
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/files.h"

namespace cast::train {

struct Curves {
  std::string label;                          // the run, in legends
  std::vector<double> steps, loss, accuracy;  // training: one point per log interval
  std::vector<double> val_steps, val_accuracy;
};

// Reads a run folder's metrics.jsonl (train and val lines); the label is the folder's name. Each
// line is checked whole: a step, a split, a finite loss and an accuracy in [0, 1].
Curves read_curves(const std::string& run_dir);
// The same from the text of a metrics file at `path` (named in its errors by line).
Curves curves_of_metrics(const std::string& text, const std::string& path, const std::string& label);

// One run: loss, and accuracy with training and validation lines.
// `link`: files::Link::refuse for a file the engine names itself in a run folder.
void plot_run(const std::string& svg_path, const std::string& title, const Curves& run,
              files::Link link = files::Link::follow_once);
// Several runs: training loss and validation accuracy of each, one colour per run.
void plot_comparison(const std::string& svg_path, const std::string& title, const std::vector<Curves>& runs,
                     files::Link link = files::Link::follow_once);

// Accuracies (in [0, 1]) against any x, one line per series: e.g. an approximation's accuracy
// against its cluster count.
struct Line {
  std::string label;
  std::vector<double> xs, ys;
  bool dashed = false;
};
void plot_lines(const std::string& svg_path, const std::string& title, const std::string& x_label,
                const std::vector<Line>& lines);

// An SVG figure's opening: the root element (`crisp`: no anti-aliasing between squares) and a
// white background.
std::string svg_open(int width, int height, bool crisp = false);

// Text for SVG and XML: & < > " escaped.
std::string xml_escape(const std::string& s);

// A qualitative palette for categories: neighbouring indices differ in hue and lightness.
void category_colour(int index, uint8_t rgb[3]);

}  // namespace cast::train
