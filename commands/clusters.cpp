// `cast clusters`: a CAST model's clusters over an image input (SVG).
#include "commands/commands.h"

#include <algorithm>
#include <climits>
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

using json = nlohmann::json;

static void print_cluster_changes(nn::Transformer& initial, nn::Transformer& trained, const data::TaskData& task,
                                  int64_t images) {
  constexpr int64_t kImagesPerBatch = 32;  // what a forward pass holds at once
  std::vector<nn::Batch> batches;
  for (int64_t at = 0; at < images; at += kImagesPerBatch) {
    std::vector<int64_t> some;
    for (int64_t i = at; i < std::min(images, at + kImagesPerBatch); ++i) some.push_back(i);
    batches.push_back(data::make_batch(task, task.test, some, DType::f32, Device::cpu));
  }
  const auto layers = train::cluster_changes(initial, trained, batches);
  fmt::print("clusters at initialisation against trained, {} test images:\n", images);
  fmt::print("{:<7} {:>24} {:>34}\n", "layer", "tokens changing cluster", "position purity initial -> trained");
  for (size_t l = 0; l < layers.size(); ++l)
    fmt::print("{:<7} {:>24} {:>34}\n", l + 1, fmt::format("{:.1f}%", 100 * layers[l].changed),
               fmt::format("{:.1f}% -> {:.1f}%", 100 * layers[l].purity_initial, 100 * layers[l].purity_trained));
  fmt::print(
      "position purity: per head and position, the share of the images clustering it that put it in its "
      "commonest cluster\n");
}

int command_clusters(const std::vector<std::string>& argv) {
  cli::Args args("clusters",
                 "Render a trained CAST model's cluster assignment over one image-task input as an SVG: one panel per "
                 "layer (rows) and head (columns), one colour per cluster with a legend; a pixel in several clusters "
                 "takes the first, a pixel in none is black; the input image is the leftmost column.");
  args.option("checkpoint", "", "CAST checkpoint of an image task (required)")
      .option("out", "clusters.svg", "output SVG")
      .flag("overwrite", "replace an existing --out that is not a cast figure")
      .option("index", "0", "which test example")
      .option("data", "", "data folder (default: the one the run used)")
      .option("scale", "4", "pixels per image pixel")
      .flag("initial", "draw the model as it was initialised (the checkpoint's settings and seed, untrained weights)")
      .option("changes", "0",
              "compare the trained clusters with the initial ones over this many test images: per layer, the "
              "share of tokens whose first cluster changed, and how much a position fixes its cluster (0: off)")
      .example("cast clusters --checkpoint runs/fashion-mnist-cast/checkpoint.safetensors --index 3 --out fm.svg")
      .example(
          "cast clusters --checkpoint runs/fashion-mnist-cast/checkpoint.safetensors --initial --changes 500 "
          "--out fm-initial.svg");
  if (!args.parse(argv)) return 0;
  CAST_CHECK_USAGE(!args.str("checkpoint").empty(), "--checkpoint is required (see cast clusters --help)");
  const int scale = static_cast<int>(args.integer("scale", 1, 64));  // pixels per image pixel
  const int64_t index = args.integer("index", 0, INT64_MAX);
  const train::Checkpoint header = train::read_checkpoint_header(args.str("checkpoint"));
  train::check_outside_data(args.str("out"), "out", header.config, args.str("data"));
  train::check_figure_output(args.str("out"), "out", args.str("checkpoint"), args.is_set("overwrite"));
  const nn::Mechanism mechanism = header.config.model.attention.mechanism;
  CAST_CHECK_USAGE(mechanism == nn::Mechanism::cast,
                   "{}: the model uses {} attention; cast clusters draws the clusters of a CAST model",
                   args.str("checkpoint"), nn::mechanism_name(mechanism));
  train::TrainedRun run = train::open_trained_run(args.str("checkpoint"), args.str("data"), Device::cpu);
  const train::Checkpoint& ck = run.checkpoint;
  const data::TaskData& task = run.task;
  CAST_CHECK_USAGE(task.image_side > 0, "{}: task {} is not an image task; cast clusters draws the clusters of images",
                   args.str("checkpoint"), task.name);
  CAST_CHECK_USAGE(index < static_cast<int64_t>(task.test.size()), "--index {} outside the {} test examples", index,
                   task.test.size());
  const int64_t changes = args.integer("changes", 0, INT64_MAX);
  CAST_CHECK_USAGE(changes <= static_cast<int64_t>(task.test.size()),
                   "--changes {} is more than the {} test examples to compare (0 turns it off)", changes,
                   task.test.size());
  // the same settings and seed build the weights the training started from
  std::optional<nn::Transformer> initial;
  if (changes > 0 || args.is_set("initial")) initial.emplace(ck.config.model, DType::f32, Device::cpu);
  if (changes > 0) print_cluster_changes(*initial, *run.model, task, changes);
  nn::Transformer& model = args.is_set("initial") ? *initial : *run.model;
  {
    autograd::NoGradGuard no_grad;
    model.forward(data::make_batch(task, task.test, {index}, DType::f32, Device::cpu), false);
  }
  train::ClustersFigure figure{task.test[index].tokens, static_cast<int>(task.image_side), scale, index,
                               args.str("checkpoint") + (args.is_set("initial") ? " as initialised" : "")};
  const std::string svg = train::clusters_svg(model, figure);
  files::write_stamped(args.str("out"), svg, "--out");
  const int64_t clusters = model.blocks().empty() ? 0 : model.blocks()[0]->last.clusters.dim(2);
  fmt::print("cast clusters: {} layers x {} heads of {} clusters -> {}\n", model.blocks().size(), ck.config.model.heads,
             clusters, args.str("out"));
  return 0;
}

}  // namespace cast
