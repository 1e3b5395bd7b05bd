// `cast train`: its options, the checks that keep a run's files apart, then the trainer (train/trainer.h).
#include "commands/commands.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/tape.h"
#include "commands/attention_options.h"
#include "tensor/files.h"
#include "train/cli.h"
#include "figures/cluster_changes.h"
#include "figures/clusters_figure.h"
#include "figures/plot.h"
#include "train/run_folder.h"
#include "train/tasks.h"
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
  const std::string run_dir = config.run_dir.empty() ? train::default_run_dir(config) : config.run_dir;
  files::check_name_fits(trace, "--trace");
  CAST_CHECK_USAGE(!files::same_path(trace, run_dir) && !std::filesystem::is_directory(trace),
                   "--trace {} is a folder: name a file", trace);
  files::check_not_inside(trace, "--trace", train::data_folder(config), "data folder");
  for (const std::string& f : run_files(config))
    CAST_CHECK_USAGE(!files::same_path(trace, f), "--trace {} is the run's own {}: name a file outside the run's files",
                     trace, f);
  // the run's own lock file is made after this check, and held: no output replaces one
  CAST_CHECK_USAGE(std::filesystem::path(trace).filename() != ".cast.lock",
                   "--trace {}: is the name of a folder's lock file (.cast.lock), which only the cast process holding "
                   "the folder writes; choose another name",
                   trace);
}

// The steps traced before a stop or a failure are written; that error, not one of the trace's,
// is the one reported.
static void keep_trace_of_a_stopped_run(const train::Trace& trace) {
  try {
    trace.write_file();
  } catch (const Error&) {
  }
}

static int train_with(const cli::Args& args, const json& file);

int command_train(const std::vector<std::string>& argv) {
  cli::Args args("train",
                 "Train a Transformer on an LRA task. With no options: generate short ListOps if missing and train a "
                 "small CAST model\non the CPU in a few minutes. Settings: task preset, then --config FILE (JSON, keys "
                 "as the flags), then flags.");
  args.option("task", "listops-short", fmt::format("{}", fmt::join(train::task_names(), " | ")))
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
  // --config's settings: of a new run, or a resume's changes
  const json file = args.str("config").empty() ? json::object() : train::read_settings_file(args.str("config"));
  CAST_CHECK_USAGE(file.is_object(), "{}: a settings file holds one JSON object", args.str("config"));
  try {
    return train_with(args, file);
  } catch (const UsageError& e) {  // a value the file gave, refused wherever it was checked, names the file
    train::rethrow_naming_settings_file(e, file, train::settings_from_flags(args), args.str("config"));
  }
}

// The command once its flags are parsed and `file`, its --config's settings, read.
static int train_with(const cli::Args& args, const json& file) {
  train::TrainConfig config;
  if (!args.str("resume").empty()) {
    // A config file's settings, then the flags': each applied, or refused by name.
    json changes = file;
    for (const auto& [key, value] : changes.items())  // a bad key named with its file, as a new run names it
      CAST_CHECK_USAGE(key == "task" || train::find_setting(key) != nullptr, "config file {}: unknown setting '{}'",
                       args.str("config"), key);
    const json flags = train::settings_from_flags(args);  // a named object: items() does not keep a temporary alive
    for (auto& [k, v] : flags.items()) changes[k] = v;
    if (args.is_set("task")) changes["task"] = args.str("task");
    train::check_task_of(train::read_checkpoint_header(args.str("resume")), args.str("resume"));
    config = train::resume_config(args.str("resume"), changes);
  } else {
    config = train::preset(train::task_of(args.str("task"), args.is_set("task"), file, args.str("config")));
    if (!args.str("config").empty()) train::apply_settings_file(config, file, args.str("config"));
    train::apply_overrides(config, train::settings_from_flags(args));  // then every relation is checked
  }
  config.overwrite = args.is_set("overwrite");
  check_config_is_no_run_file(config, args.str("config"));
  std::optional<train::Trace> trace;
  if (args.is_set("trace")) {
    const std::string& file = args.str("trace");
    if (!file.empty()) check_trace_is_no_run_file(config, file, args.str("config"), args.str("resume"));
    const std::string run_dir = config.run_dir.empty() ? train::default_run_dir(config) : config.run_dir;
    // --overwrite replaces the run only; a trace in the run's own folder may replace its last trace
    trace.emplace(file, true, /*overwrite=*/false, /*may_overwrite=*/false, run_dir);
    config.trace = &*trace;
  }
  cli::check_options_of_mechanisms(args, {config.model.attention.mechanism});
  // --config's keys that the run's mechanism does not read: said, not refused (one file may serve
  // several mechanisms)
  cli::note_unread_config_options(file, {config.model.attention.mechanism}, args.str("config"));
  config.on_start = [](const train::TrainConfig& c, Device device) {
    fmt::print("cast train: task {}, attention {}, {} layers, D {}, {} heads, {} steps of batch {}, device {}{}\n",
               c.task, nn::mechanism_name(c.model.attention.mechanism), c.model.layers, c.model.dim, c.model.heads,
               c.steps, c.batch, device_name(device), c.recompute ? ", each block recomputed in its backward" : "");
    cli::note_cluster_counts_for(c.model);
  };
  try {
    train::run_training(config, args.str("resume"));
  } catch (...) {  // stopped (Ctrl-C) or failed: the steps traced in full are kept
    if (trace) keep_trace_of_a_stopped_run(*trace);
    throw;
  }
  if (trace) trace->write_file();
  return 0;
}

}  // namespace cast
