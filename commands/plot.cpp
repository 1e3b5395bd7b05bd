// `cast plot`: one run's curves, or several runs side by side (SVG).
#include "commands/commands.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/tape.h"
#include "tensor/files.h"
#include "train/cli.h"
#include "figures/cluster_changes.h"
#include "figures/clusters_figure.h"
#include "figures/plot.h"
#include "train/run_folder.h"
#include "train/trace.h"
#include "train/trainer.h"

namespace cast {

namespace {
// A comparison folder (cast compare's --out) holds runs, not metrics: the refusal names them.
void check_not_a_comparison(const std::string& folder) {
  if (files::exists(folder + "/metrics.jsonl")) return;
  std::vector<std::string> held, figures;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (files::exists(entry.path().string() + "/metrics.jsonl")) held.push_back(entry.path().string());
    if (name.rfind("comparison", 0) == 0 && entry.path().extension() == ".svg") figures.push_back(name);
  }
  if (held.empty()) return;  // no metrics here or below: read_curves says so
  std::sort(held.begin(), held.end());
  std::sort(figures.begin(), figures.end());
  throw UsageError(fmt::format("{} holds runs, not a run's metrics: plot them with `cast plot {}`{}", folder,
                               fmt::join(held, " "),
                               figures.empty() ? std::string()
                                               : fmt::format(" (their comparison's figure is {}/{})", folder,
                                                             figures.front())));
}
}  // namespace

using json = nlohmann::json;

int command_plot(const std::vector<std::string>& argv) {
  cli::Args args(
      "plot",
      "Plot run folders' metrics.jsonl as SVG: one folder gives training loss and training/validation "
      "accuracy against the step; several give a comparison (training loss and validation accuracy of each).");
  args.option("out", "", "output SVG (one run: <run>/curves.svg; several: comparison.svg)")
      .flag("overwrite", "replace an existing --out that is not a cast figure")
      .option("title", "", "figure title (default: the run folders)")
      .usage("cast plot <run folder> [<run folder> ...] [options]")
      .example("cast plot runs/listops-short-cast                 (writes runs/listops-short-cast/curves.svg)")
      .example("cast plot runs/fm-full runs/fm-cast --out fm.svg --title \"Fashion-MNIST: full vs CAST\"");
  std::vector<std::string> runs, options;  // run folders are the words that are not options or their values
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--out" || argv[i] == "--title") {
      options.push_back(argv[i]);
      if (i + 1 < argv.size()) options.push_back(argv[++i]);
    } else if (argv[i].rfind("-", 0) == 0) {
      options.push_back(argv[i]);
    } else {
      runs.push_back(argv[i]);
    }
  }
  if (!args.parse(options)) return 0;
  CAST_CHECK_USAGE(!runs.empty(), "name at least one run folder (see cast plot --help)");
  // a file named as a run is that mistake, not an --out the user never gave
  for (const std::string& r : runs) files::require_folder(r, "run folder");
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      CAST_CHECK_USAGE(!files::same_path(runs[i], runs[j]), "run folder {} is listed twice (as {} and {})", runs[i],
                       runs[j], runs[i]);
  std::string out = args.str("out"), title = args.str("title");
  // the default figure inside a run folder is the engine's own file: never written through a link
  const files::Link link = out.empty() && runs.size() == 1 ? files::Link::refuse : files::Link::follow_once;
  // messages about a figure the user did not name call it the figure, not an --out never given
  const std::string what = out.empty() ? "figure" : "--out";
  const std::string remedy = out.empty() ? "pass --out to draw it elsewhere, or --overwrite to replace it"
                                         : "pass --overwrite to replace it, or choose another path";
  if (out.empty()) out = runs.size() == 1 ? runs[0] + "/curves.svg" : "comparison.svg";
  std::vector<std::string> inputs;  // a figure never replaces a run's metrics, checkpoints or summary
  for (const std::string& r : runs)
    for (const std::string& f : train::run_folder_files(r)) inputs.push_back(f);
  files::check_not_an_input(out, what, inputs);
  // the run's own figure is never written through a link: said first, not after --overwrite advice
  if (link == files::Link::refuse) files::output_target(out, what, link);
  // a run's own figure is redrawn from its own metrics; any other file of a held folder is kept
  const bool own_figure = runs.size() == 1 && files::same_path(out, runs[0] + "/curves.svg");
  train::check_user_output(out, what, "a figure drawn by cast", files::kFigureMark, args.is_set("overwrite"),
                           own_figure ? runs[0] : "", remedy);
  // a figure goes into a run folder only while no other cast process (a training) owns it
  std::optional<files::FolderLock> lock;
  const std::string out_folder = std::filesystem::path(out).parent_path().string();
  if (files::exists((out_folder.empty() ? "." : out_folder) + "/.cast.lock")) {
    try {
      lock.emplace(out_folder.empty() ? "." : out_folder, "run folder");
    } catch (const Error& e) {  // a run still training: its figure can be drawn elsewhere meanwhile
      if (args.str("out").empty() && std::string(e.what()).find("is in use") != std::string::npos)
        throw Error(fmt::format("{} (or draw its figure now elsewhere with --out FILE.svg)", e.what()));
      throw;
    }
  }
  std::vector<train::Curves> curves;
  for (const std::string& r : runs) {
    check_not_a_comparison(r);
    curves.push_back(train::read_curves(r));
    CAST_CHECK(!curves.back().steps.empty() || !curves.back().val_steps.empty(),
               "run folder {}: its metrics.jsonl holds no step yet: nothing to plot", r);
  }
  if (curves.size() == 1) {
    train::plot_run(out, title.empty() ? curves[0].label : title, curves[0], link);
  } else {
    std::string names;
    for (const auto& c : curves) names += (names.empty() ? "" : ", ") + c.label;
    train::plot_comparison(out, title.empty() ? names : title, curves, link);
  }
  fmt::print("cast plot: {} -> {}\n", curves.size() == 1 ? runs[0] : fmt::format("{} runs", curves.size()), out);
  return 0;
}

}  // namespace cast
