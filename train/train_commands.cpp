// `cast train`, `cast eval`, `cast data`, `cast clusters`, `cast plot`: each its options, then
// calls into the library (train/).
#include "train/train_commands.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/tape.h"
#include "tensor/files.h"
#include "train/cli.h"
#include "train/cluster_changes.h"
#include "train/clusters_figure.h"
#include "train/plot.h"
#include "train/run_folder.h"
#include "train/trace.h"
#include "train/trainer.h"

namespace cast {

using json = nlohmann::json;

// The files a run writes in its folder.
static std::vector<std::string> run_files(const train::TrainConfig& config) {
  const std::string run_dir = config.run_dir.empty() ? train::default_run_dir(config) : config.run_dir;
  std::vector<std::string> files = train::run_folder_files(run_dir);
  files.push_back(run_dir + "/curves.svg");
  return files;
}

// The settings file is an input: a run writing (or, with --overwrite, removing) it would lose it.
static void check_config_is_no_run_file(const train::TrainConfig& config, const std::string& config_path) {
  if (config_path.empty()) return;
  for (const std::string& out : run_files(config)) files::check_not_an_input(out, "run file", {config_path});
}

// The trace file is written at the end: it must be neither an input nor a file the run keeps
// (train::Trace checks, as it opens, that it can be written).
static void check_trace_is_no_run_file(const train::TrainConfig& config, const std::string& trace,
                                       const std::string& config_path, const std::string& resume) {
  files::check_not_an_input(trace, "--trace", {config_path, resume});
  for (const std::string& f : run_files(config))
    CAST_CHECK_USAGE(!files::same_path(trace, f), "--trace {} is the run's own {}: name a file outside the run's files",
                     trace, f);
}

// The steps traced before a stop or a failure are written; that error, not one of the trace's,
// is the one reported.
static void keep_trace_of_a_stopped_run(const train::Trace& trace) {
  try {
    trace.write_file();
  } catch (const Error&) {
  }
}

// CAST's Top-K with κ at least the longest sequence puts every token in every cluster: that is
// full attention, and the gate and surrogates get no gradient (docs/attention.md). Said once,
// before the run, since the run itself is valid.
static void note_cast_without_clusters(const nn::ModelConfig& m) {
  const nn::AttentionConfig& a = m.attention;
  const int64_t longest = m.tokens() + (m.cls_pooling ? 1 : 0);
  if (a.mechanism != nn::Mechanism::cast || a.single_assignment || a.cluster_size < longest) return;
  fmt::print(
      "note: cluster size {} >= the {} tokens of the longest sequence: every CAST cluster holds every token, "
      "which is full attention (the gate and surrogates learn nothing); give --cluster-size below {}\n",
      a.cluster_size, longest, longest);
}

int command_train(const std::vector<std::string>& argv) {
  cli::Args args("train",
                 "Train a Transformer on an LRA task. With no options: generate short ListOps if missing and train a "
                 "small CAST model\non the CPU in a few minutes. Settings: task preset, then --config FILE (JSON, keys "
                 "as the flags), then flags.");
  args.option(
          "task", "listops-short",
          "listops-short | listops | text | retrieval | image | pathfinder | pathx | fashion-mnist | fashion-mnist-14")
      .option("config", "", "JSON file of settings")
      .option("resume", "",
              "checkpoint to continue from, in its own folder unless --run names another (its settings "
              "are used; steps, logging, evaluation, checkpoints, data, device may change)");
  train::declare_setting_flags(args, {});
  args.flag("overwrite", "replace the run already in the run folder (without it, such a folder is refused)");
  args.optional_value("trace", "FILE",
                      "print every step's tape: each node's op, implementation, shapes, saved tensors and time "
                      "(with FILE: JSON lines there instead)");
  args.example("cast train                                     (short ListOps, a small CAST model)")
      .example("cast train --task fashion-mnist --attention full --steps 3000")
      .example("cast train --task listops --config settings.json --run runs/my-listops")
      .example("cast train --resume runs/listops-short-cast/checkpoint.safetensors --steps 2400")
      .example("cast train --steps 1 --trace                   (the tape of one step)");
  if (!args.parse(argv)) return 0;

  train::TrainConfig config;
  if (!args.str("resume").empty()) {
    // A config file's settings, then the flags': each applied, or refused by name.
    json changes = args.str("config").empty() ? json::object() : train::read_settings_file(args.str("config"));
    CAST_CHECK_USAGE(changes.is_object(), "{}: a settings file holds one JSON object", args.str("config"));
    const json flags = train::settings_from_flags(args);  // a named object: items() does not keep a temporary alive
    for (auto& [k, v] : flags.items()) changes[k] = v;
    if (args.is_set("task")) changes["task"] = args.str("task");
    config = train::resume_config(args.str("resume"), changes);
  } else {
    config = train::preset(args.str("task"));
    if (!args.str("config").empty()) train::apply_settings_file(config, args.str("config"));
    train::apply_overrides(config, train::settings_from_flags(args));
  }
  config.overwrite = args.is_set("overwrite");
  check_config_is_no_run_file(config, args.str("config"));
  std::optional<train::Trace> trace;
  if (args.is_set("trace")) {
    const std::string& file = args.str("trace");
    if (!file.empty()) check_trace_is_no_run_file(config, file, args.str("config"), args.str("resume"));
    trace.emplace(file);
    config.trace = &*trace;
  }
  fmt::print("cast train: task {}, attention {}, {} layers, D {}, {} heads, {} steps of batch {}, device {}\n",
             config.task, nn::mechanism_name(config.model.attention.mechanism), config.model.layers, config.model.dim,
             config.model.heads, config.steps, config.batch, device_name(train::resolve_device(config.device)));
  note_cast_without_clusters(config.model);
  try {
    train::run_training(config, args.str("resume"));
  } catch (...) {  // stopped (Ctrl-C) or failed: the steps traced in full are kept
    if (trace) keep_trace_of_a_stopped_run(*trace);
    throw;
  }
  if (trace) trace->write_file();
  return 0;
}

namespace {

void print_eval(const std::string& name, const train::EvalResult& r) {
  if (r.examples == 0) return fmt::print("  {:<19} no examples\n", name);
  fmt::print("  {:<19} {:.2f}%  loss {:.4f}  ({} examples; majority class {:.2f}% of them)\n", name, 100 * r.accuracy,
             r.loss, r.examples, 100 * r.majority);
}

// Every mechanism x top keys x C of the lists, evaluated with the trained model's weights: a
// Markdown table and, with `figure`, test accuracy against C.
void eval_sweep(const train::TrainedRun& run, const std::vector<std::string>& mechanisms,
                const std::vector<int64_t>& clusters, const std::vector<int64_t>& topks,
                const nn::AttentionConfig& base, int64_t limit, Device device, const std::string& checkpoint,
                const std::string& figure) {
  const train::Checkpoint& trained_ck = run.checkpoint;
  nn::Transformer& trained = *run.model;
  const data::TaskData& task = run.task;
  const int64_t batch = trained_ck.config.batch;
  // validation before test, as a single evaluation does: the LSH draws follow the forward count
  const auto trained_val = train::evaluate(trained, task, task.val, batch, limit, device);
  const auto trained_test = train::evaluate(trained, task, task.test, batch, limit, device);
  // the sequence the attention sees, for the defaults C = 0 and top keys above it
  const nn::ModelConfig& m = trained_ck.config.model;
  const int64_t n = std::min(m.tokens(), task.max_len / (m.patch * m.patch)) + (m.cls_pooling ? 1 : 0);
  fmt::print("{} (step {}, task {}, trained with {} attention), evaluated with the same weights:\n\n", checkpoint,
             trained_ck.step, trained_ck.config.task, nn::mechanism_name(trained_ck.config.model.attention.mechanism));
  fmt::print("| attention | C | top keys | test % | validation % |\n|---|---|---|---|---|\n");
  fmt::print("| {} (trained) | | | {:.2f} | {:.2f} |\n",
             nn::mechanism_name(trained_ck.config.model.attention.mechanism), 100 * trained_test.accuracy,
             100 * trained_val.accuracy);
  std::vector<train::Line> lines;
  for (const std::string& name : mechanisms) {
    const nn::Mechanism mechanism = nn::parse_mechanism(name);
    const bool top = mechanism == nn::Mechanism::iclustered;
    for (int64_t k : top ? topks : std::vector<int64_t>{topks.front()}) {
      train::Line line{top ? fmt::format("{}, {} top keys", name, k) : name, {}, {}};
      for (int64_t c : clusters) {
        nn::AttentionConfig a = base;
        a.mechanism = mechanism, a.clusters = c, a.topk = k;
        const auto swapped = train::with_attention(trained, a, device);
        const auto val = train::evaluate(*swapped, task, task.val, batch, limit, device);
        const auto test = train::evaluate(*swapped, task, task.test, batch, limit, device);
        const int64_t clusters_used = c > 0 ? c : nn::default_clusters(n);
        fmt::print("| {} | {} | {} | {:.2f} | {:.2f} |\n", name, clusters_used,
                   top ? std::to_string(std::min(k, n)) : "", 100 * test.accuracy, 100 * val.accuracy);
        std::fflush(stdout);
        line.xs.push_back(static_cast<double>(clusters_used));
        line.ys.push_back(test.accuracy);
      }
      lines.push_back(line);
    }
  }
  if (figure.empty()) return;
  train::Line reference{"trained model", {}, {}, true};
  reference.xs = lines.front().xs;
  reference.ys.assign(reference.xs.size(), trained_test.accuracy);
  lines.push_back(reference);
  train::plot_lines(figure, fmt::format("{}: test accuracy with the trained weights", trained_ck.config.task),
                    "clusters C", lines);
  fmt::print("\n-> {}\n", figure);
}

}  // namespace

int command_eval(const std::vector<std::string>& argv) {
  cli::Args args("eval",
                 "Evaluate a checkpoint on the validation and test splits of its task; with --attention, with another "
                 "mechanism and the same weights (a full-attention model approximated by clustered attention, "
                 "without retraining). Lists (--attention clustered,iclustered --clusters 4,8,16) evaluate every "
                 "combination and print one table.");
  args.option("checkpoint", "", "checkpoint file (required)")
      .option("data", "", "data folder (default: the one the run used)")
      .option("device", "auto", "auto | cpu | cuda")
      .option("eval-limit", "0", "examples per split (0: all)")
      .option("precision", "",
              "products on the GPU: fp32 | tf32 | bf16 (default: the checkpoint's on the GPU, fp32 on the CPU)")
      .option("attention", "",
              "evaluate with this mechanism instead, or a comma-separated list: full | clustered | iclustered (CAST "
              "is refused: its surrogates and gate are not in a model trained without them)")
      .option("clusters", "0", "with --attention: clusters C, or a list (0: ceil(sqrt(N)) rounded up to 8)")
      .option("topk", "32", "with --attention iclustered: keys per cluster, or a list")
      .option("bits", "63", "with --attention: LSH hash bits")
      .option("iterations", "10", "with --attention: Lloyd iterations")
      .option("figure", "", "with --attention: an SVG of test accuracy against C, one line per mechanism")
      .example("cast eval --checkpoint runs/listops-short-cast/checkpoint.safetensors")
      .example("cast eval --checkpoint runs/fashion-mnist-cast/best.safetensors --eval-limit 1000")
      .example(
          "cast eval --checkpoint runs/fashion-mnist-full/checkpoint.safetensors --attention iclustered "
          "--clusters 8")
      .example(
          "cast eval --checkpoint runs/fm-full/checkpoint.safetensors --attention clustered,iclustered --clusters "
          "4,8,16,32 --topk 4,8 --figure approximation.svg");
  if (!args.parse(argv)) return 0;
  const int64_t limit = args.integer("eval-limit", 0, int64_t{1} << 40);
  CAST_CHECK_USAGE(!args.str("checkpoint").empty(), "--checkpoint is required (see cast eval --help)");
  const std::string swap = args.str("attention");
  for (const char* option : {"clusters", "topk", "bits", "iterations", "figure"})
    CAST_CHECK_USAGE(!swap.empty() || !args.is_set(option),
                     "--{} sets the mechanism given by --attention, and there is none (the checkpoint's own settings "
                     "are used without it)",
                     option);
  nn::AttentionConfig attention;
  std::vector<std::string> mechanisms;
  std::vector<int64_t> clusters, topks;
  if (!swap.empty()) {
    mechanisms = cli::comma_list("attention", swap);
    for (const std::string& m : mechanisms)
      CAST_CHECK_USAGE(m == "full" || m == "clustered" || m == "iclustered" || m == "cast",
                       "--attention must be full, clustered or iclustered, got '{}'", m);
    attention.mechanism = nn::parse_mechanism(mechanisms.front());
    clusters = cli::comma_integers("clusters", args.str("clusters"), 0, 1 << 16);
    topks = cli::comma_integers("topk", args.str("topk"), 1, 1 << 22);
    attention.clusters = clusters.front();
    attention.topk = topks.front();
    attention.bits = args.integer("bits", 1, 63);
    attention.iterations = args.integer("iterations", 0, 100000);
  }
  const std::string figure = args.str("figure");
  if (!figure.empty()) train::check_figure_output(figure, "figure", args.str("checkpoint"));
  const Device device = train::resolve_device(args.str("device"));
  if (!args.str("precision").empty()) train::use_precision(args.str("precision"), device);
  train::TrainedRun run = train::open_trained_run(args.str("checkpoint"), args.str("data"), device);
  if (args.str("precision").empty())
    train::use_precision(device == Device::cuda ? run.checkpoint.config.precision : "fp32", device);
  const bool sweep = mechanisms.size() > 1 || clusters.size() > 1 || topks.size() > 1 || !figure.empty();
  if (sweep) {
    for (const std::string& name : mechanisms)  // refused before any evaluation
      train::check_swappable(run.checkpoint.config.model.attention.mechanism, nn::parse_mechanism(name));
    eval_sweep(run, mechanisms, clusters, topks, attention, limit, device, args.str("checkpoint"), figure);
    return 0;
  }
  const nn::Mechanism trained = run.checkpoint.config.model.attention.mechanism;
  if (!swap.empty()) train::swap_attention(run, attention, device);
  const train::Checkpoint& ck = run.checkpoint;
  nn::Transformer& model = *run.model;
  const data::TaskData& task = run.task;
  auto val = train::evaluate(model, task, task.val, ck.config.batch, limit, device);
  auto test = train::evaluate(model, task, task.test, ck.config.batch, limit, device);
  std::string how = nn::mechanism_name(trained);
  if (!swap.empty()) {
    const nn::AttentionConfig& a = ck.config.model.attention;
    how = fmt::format("{} in place of the trained {}, the same weights; clusters {}{}", nn::mechanism_name(a.mechanism),
                      nn::mechanism_name(trained),
                      a.clusters > 0 ? std::to_string(a.clusters) : "ceil(sqrt(N)) rounded up to 8",
                      a.mechanism == nn::Mechanism::iclustered ? fmt::format(", top keys {}", a.topk) : "");
  }
  fmt::print("{} (step {}, task {}, attention {})\n", args.str("checkpoint"), ck.step, ck.config.task, how);
  print_eval("validation accuracy", val);
  print_eval("test accuracy", test);
  return 0;
}

int command_data(const std::vector<std::string>& argv) {
  cli::Args args("data",
                 "Generate a task in the LRA release layout: --task listops | listops-short | pathfinder | pathx.");
  args.option("task", "", "listops | listops-short | pathfinder | pathx")
      .option("out", "", "output folder (default: data/<name>)")
      .option("count", "0",
              "training examples for ListOps (0: 96000, short 6000); images for pathfinder/pathx "
              "(0: 2000)")
      .option("max-length", "0", "ListOps: longest expression in tokens (0: 2000 as in LRA, short 48)")
      .option("min-length", "0", "ListOps: shortest expression (0: a quarter of --max-length, as LRA's 500 of 2000)")
      .option("seed", "1", "seed")
      .usage("cast data <task> [options]   (or --task <task>)")
      .example("cast data listops")
      .example("cast data listops --max-length 512 --count 20000 --out data/listops-512")
      .example("cast data pathfinder --count 500 --out data/pf-small")
      .example("cast data pathx --count 200 --seed 3");
  std::vector<std::string> rest = argv;
  if (!rest.empty() && rest[0].rfind("--", 0) != 0) rest.insert(rest.begin(), "--task");  // `cast data listops`
  if (!args.parse(rest)) return 0;
  const std::string task = args.choice("task", {"listops", "listops-short", "pathfinder", "pathx"});
  const bool listops = task == "listops" || task == "listops-short";
  const int64_t max_count = listops ? 10'000'000 : 1'000'000;  // a bound on what a disk and a run can take
  const int64_t seed = args.integer("seed", 0, INT64_MAX), count = args.integer("count", 0, max_count);
  CAST_CHECK_USAGE(listops || (!args.is_set("max-length") && !args.is_set("min-length")),
                   "--max-length and --min-length are ListOps options");
  const int64_t max_length = args.integer("max-length", 0, 100000), min_length = args.integer("min-length", 0, 100000);
  std::string out = args.str("out");
  if (listops) {
    if (out.empty()) out = train::find_task(task).data_dir;
    data::ListOpsSpec spec = task == "listops" ? data::ListOpsSpec::release() : data::ListOpsSpec::short_cpu();
    if (count > 0) spec.train = count;
    if (max_length > 0) {
      spec.max_length = static_cast<int>(max_length);
      spec.min_length = static_cast<int>(max_length / 4);
    }
    if (min_length > 0) spec.min_length = static_cast<int>(min_length);
    CAST_CHECK_USAGE(spec.min_length >= 1 && spec.min_length + 1 < spec.max_length,
                     "ListOps keeps lengths strictly between the shortest ({}) and the longest ({}): none are; use "
                     "--max-length 8 or more, and --min-length at least 1 and below it minus 1",
                     spec.min_length, spec.max_length);
    data::generate_listops(out, spec, static_cast<uint64_t>(seed));
  } else {
    if (out.empty()) out = train::find_task(task).data_dir;
    data::PathfinderSpec spec =
        task == "pathx" ? data::PathfinderSpec::pathx128() : data::PathfinderSpec::pathfinder32();
    if (count > 0) spec.count = count;
    data::generate_pathfinder(out, spec, static_cast<uint64_t>(seed));
  }
  fmt::print("cast data: wrote {} into {}\n", task, out);
  return 0;
}

// What training changed in the clusters, on the first `images` test images, as a table.
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
  train::check_figure_output(args.str("out"), "out", args.str("checkpoint"));
  train::TrainedRun run = train::open_trained_run(args.str("checkpoint"), args.str("data"), Device::cpu);
  const train::Checkpoint& ck = run.checkpoint;
  CAST_CHECK(ck.config.model.attention.mechanism == nn::Mechanism::cast, "{}: the model uses {} attention, not cast",
             args.str("checkpoint"), nn::mechanism_name(ck.config.model.attention.mechanism));
  const data::TaskData& task = run.task;
  CAST_CHECK(task.image_side > 0, "task {} is not an image task", task.name);
  CAST_CHECK_USAGE(index < static_cast<int64_t>(task.test.size()), "--index {} outside the {} test examples", index,
                   task.test.size());
  const int64_t changes = args.integer("changes", 0, static_cast<int64_t>(task.test.size()));
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
  files::write_atomic(args.str("out"), svg, "--out");
  const int64_t clusters = model.blocks().empty() ? 0 : model.blocks()[0]->last.clusters.dim(2);
  fmt::print("cast clusters: {} layers x {} heads of {} clusters -> {}\n", model.blocks().size(), ck.config.model.heads,
             clusters, args.str("out"));
  return 0;
}

int command_plot(const std::vector<std::string>& argv) {
  cli::Args args(
      "plot",
      "Plot run folders' metrics.jsonl as SVG: one folder gives training loss and training/validation "
      "accuracy against the step; several give a comparison (training loss and validation accuracy of each).");
  args.option("out", "", "output SVG (one run: <run>/curves.svg; several: comparison.svg)")
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
  std::string out = args.str("out"), title = args.str("title");
  // the default figure inside a run folder is the engine's own file: never written through a link
  const files::Link link = out.empty() && runs.size() == 1 ? files::Link::refuse : files::Link::follow_once;
  if (out.empty()) out = runs.size() == 1 ? runs[0] + "/curves.svg" : "comparison.svg";
  std::vector<std::string> inputs;  // a figure never replaces a run's metrics, checkpoints or summary
  for (const std::string& r : runs)
    for (const std::string& f : train::run_folder_files(r)) inputs.push_back(f);
  files::check_not_an_input(out, "--out", inputs);
  files::check_replaces_own_kind(out, "--out", "an SVG figure", files::looks_like_svg);
  std::vector<train::Curves> curves;
  for (const std::string& r : runs) curves.push_back(train::read_curves(r));
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
