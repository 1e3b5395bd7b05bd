// `cast compare`: its options, turned into a comparison (train/compare.h).
#include <algorithm>
#include <cctype>

#include "tensor/error.h"
#include "tensor/files.h"
#include "train/cli.h"
#include "train/compare.h"
#include "train/tasks.h"
#include "train/settings.h"
#include "train/stop.h"
#include "commands/attention_options.h"
#include "commands/commands.h"
#include "tensor/text.h"

namespace cast {

using json = nlohmann::json;

namespace {

nn::Mechanism usage_mechanism(const std::string& name) {
  try {
    return nn::parse_mechanism(name);
  } catch (const Error& e) {
    std::string said = e.what();
    if (said.rfind("attention: ", 0) == 0) said.erase(0, 11);  // the option names it
    const bool spaced = name.find(' ') != std::string::npos;
    throw UsageError(fmt::format("--attention: {}{}", said,
                                 spaced ? "; a space beside a comma is part of the name: list them as full,cast" : ""));
  }
}

cli::Args compare_args() {
  cli::Args args("compare",
                 "Train one task with several attention mechanisms (or several values of one setting) and seeds, each "
                 "an ordinary run\nin its own folder under --out, then write results.md and results.json (accuracy "
                 "mean ± standard deviation over\nseeds, steps, wall time, step time, peak memory) and comparison.svg "
                 "(validation accuracy and training loss\nagainst step). Run the same command again after an "
                 "interruption: finished runs are kept, unfinished ones resume\nfrom their checkpoints.");
  args.option("task", "listops-short", fmt::format("{}", fmt::join(train::task_names(), " | ")))
      .option("attention", "", "comma-separated mechanisms (default full,cast,clustered,iclustered); with --vary, one")
      .option("vary", "", "SETTING=V1,V2,...: compare values of any train setting instead of mechanisms")
      .option("seeds", "1", "comma-separated seeds; each variant runs once per seed")
      .option("out", "",
              "comparison folder (default runs/compare-<task>); with --vary the files are "
              "results-<setting>.md and so on, and a run equal to one already there is reused")
      .option("config", "", "JSON file of settings shared by every run")
      .flag("overwrite", "replace results and figures in --out that cast compare did not write (never a run)");
  train::declare_setting_flags(args, {"attention", "run", "seed"});
  args.example("cast compare --task listops-short --steps 300")
      .example("cast compare --task fashion-mnist-14 --attention full,cast --seeds 1,2,3")
      .example("cast compare --task fashion-mnist-14 --attention cast --vary clustering=topk,satopk --seeds 1,2")
      .example(
          "cast compare --task fashion-mnist-14 --attention cast --vary summaries=on,off --out "
          "runs/ablation-summaries");
  return args;
}

// The runs' variants: the mechanisms of `attention` (--attention, else --config's), or the values
// of --vary's setting.
void add_variants(const cli::Args& args, const std::string& attention, train::CompareSpec& spec) {
  if (args.str("vary").empty()) {
    const std::string list = !attention.empty() ? attention : "full,cast,clustered,iclustered";
    std::vector<nn::Mechanism> mechanisms;
    for (const std::string& name : cli::comma_list("attention", list)) {
      mechanisms.push_back(usage_mechanism(name));  // an unknown mechanism fails before any run
      spec.variants.push_back({name, {{"attention", name}}});
    }
    cli::check_options_of_mechanisms(args, mechanisms);  // a flag none of them reads
    return;
  }
  const std::string vary = args.str("vary");
  const size_t eq = vary.find('=');
  CAST_CHECK_USAGE(eq != std::string::npos && eq > 0, "--vary expects SETTING=V1,V2,..., got '{}'", vary);
  const std::string key = vary.substr(0, eq);
  CAST_CHECK_USAGE(eq + 1 < vary.size(), "--vary {}: no values after '=': give them as {}=V1,V2,...", key, key);
  CAST_CHECK_USAGE(key != "attention" && key != "seed" && key != "run",
                   "--vary {}: use --attention, --seeds or --out for that", key);
  // cast train's flags that are no settings of a run: one comparison is of one task and its own files
  CAST_CHECK_USAGE(key != "task" && key != "overwrite" && key != "resume" && key != "config",
                   "--vary {}: a comparison is of one task, with its own files; vary a setting of the runs (cast "
                   "train --help lists them)",
                   key);
  // a value given as well (--steps 3 --vary steps=2,3) would be replaced without a word
  CAST_CHECK_USAGE(!spec.settings.contains(key),
                   "--vary {} and a value of '{}' (a flag or --config) are both given: "
                   "give the values in --vary only",
                   key, key);
  if (!attention.empty()) {
    CAST_CHECK_USAGE(attention.find(',') == std::string::npos,
                     "--attention names one mechanism when --vary is given, got '{}'", attention);
    spec.settings["attention"] = attention;
  }
  const nn::Mechanism mechanism =
      attention.empty() ? train::preset(spec.task).model.attention.mechanism : usage_mechanism(attention);
  cli::check_options_of_mechanisms(args, {mechanism});
  // values the mechanism never reads would train one model several times, tabled as a study
  cli::check_option_read_by(key, {mechanism}, "--vary " + key);
  for (const std::string& value : cli::comma_list("vary", vary.substr(eq + 1))) {
    const json parsed = train::setting_from_text(key, value);
    // a folder under two spellings (d/e and d//e) is one folder: compared as paths
    const bool folder = key == "data";
    const auto same = [&](const json& a) {
      if (!folder || !a.is_string() || !parsed.is_string()) return a == parsed;
      return files::same_path(a.get<std::string>(), parsed.get<std::string>());
    };
    for (const auto& [label, settings] : spec.variants)  // 0.001 and 1e-3: one run shown as two
      CAST_CHECK_USAGE(!same(settings.at(key)), "--vary {}: '{}' is the value of '{}' again: list it once", key,
                       value, label);
    spec.variants.push_back({key + "=" + value, {{key, parsed}}});
  }
  spec.name = key;
}

// Every setting of --config applies to a run of `task`: a bad one is refused naming the file.
void check_config_settings(const std::string& task, json settings, const std::string& config) {
  if (config.empty()) return;
  settings.erase("attention");  // the mechanisms to compare, checked as variants
  train::TrainConfig probe = train::preset(task);
  try {
    train::apply_overrides(probe, settings, train::Check::each);  // relations: with the flags and variants
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("config file {}: {}", config, e.what()));
  }
}

// --seeds: distinct whole numbers ("1,01" and "+1,1" are one seed twice), written as every other
// integer setting is (text::read_decimal: a sign, then digits; no space).
std::vector<uint64_t> seeds_of(const std::string& list) {
  std::vector<uint64_t> seeds;
  for (const std::string& seed : cli::comma_list("seeds", list)) {
    int64_t s = -1;
    const text::Decimal read = text::read_decimal(seed, s);
    CAST_CHECK_USAGE(read != text::Decimal::out_of_range,
                     "--seeds: {} is out of range (seeds are 0 to 9223372036854775807)", seed);
    CAST_CHECK_USAGE(read == text::Decimal::ok && s >= 0, "--seeds: '{}' is not a seed (a whole number, 0 or more)",
                     seed);
    CAST_CHECK_USAGE(std::find(seeds.begin(), seeds.end(), static_cast<uint64_t>(s)) == seeds.end(),
                     "--seeds: seed {} is listed twice ('{}')", s, list);
    seeds.push_back(static_cast<uint64_t>(s));
  }
  return seeds;
}

}  // namespace

static int compare_with(const cli::Args& args, const std::vector<std::string>& argv, const json& file);

int command_compare(const std::vector<std::string>& argv) {
  cli::Args args = compare_args();
  if (!args.parse(argv)) return 0;

  const json file = args.str("config").empty() ? json::object() : train::read_settings_file(args.str("config"));
  CAST_CHECK_USAGE(file.is_object(), "{}: a settings file holds one JSON object", args.str("config"));
  try {
    return compare_with(args, argv, file);
  } catch (const UsageError& e) {  // a value the file gave, refused wherever it was checked, names the file
    train::rethrow_naming_settings_file(e, file, train::settings_from_flags(args), args.str("config"));
  }
}

// The command once its flags are parsed and `file`, its --config's settings, read.
static int compare_with(const cli::Args& args, const std::vector<std::string>& argv, const json& file) {
  train::CompareSpec spec;
  spec.settings = file;
  spec.task = train::task_of(args.str("task"), args.is_set("task"), spec.settings, args.str("config"));
  train::preset(spec.task);  // an unknown task fails here, before any folder is made
  // --config's keys: each applied to every run, or refused naming the file
  const std::string config = args.str("config");
  for (const char* own : {"run", "seed"})
    CAST_CHECK_USAGE(!spec.settings.contains(own),
                     "config file {}: setting '{}' is cast compare's to choose for each run: use --out and --seeds "
                     "instead",
                     config,
                     own);
  std::string attention = args.str("attention");  // the flag, else the file's mechanisms
  const bool attention_from_file = attention.empty() && spec.settings.contains("attention");
  // the file's mechanisms under the flag's are read all the same: checked as every value is
  if (!attention_from_file && spec.settings.contains("attention")) {
    const json& theirs = spec.settings["attention"];
    CAST_CHECK_USAGE(theirs.is_string() && !theirs.get<std::string>().empty(),
                     "config file {}: setting 'attention' is {}, where a mechanism or a comma-separated list of them "
                     "is expected",
                     config, files::json_excerpt(theirs));
    try {
      for (const std::string& name : cli::comma_list("attention", theirs.get<std::string>())) usage_mechanism(name);
    } catch (const UsageError& e) {
      std::string said = e.what();
      if (said.rfind("--attention: ", 0) == 0) said.erase(0, 13);
      throw UsageError(fmt::format("config file {}: setting 'attention': {}", config, said));
    }
  }
  if (attention_from_file) {
    CAST_CHECK_USAGE(spec.settings["attention"].is_string(),
                     "config file {}: setting 'attention' is {}, where a string is expected: a mechanism or a "
                     "comma-separated list of them (\"full,cast\")",
                     config, files::json_excerpt(spec.settings["attention"]));
    attention = spec.settings["attention"].get<std::string>();
    CAST_CHECK_USAGE(!attention.empty(),
                     "config file {}: setting 'attention' is empty: name a mechanism or a list of them", config);
  }
  check_config_settings(spec.task, spec.settings, config);
  const json config_file = spec.settings;  // the file's own keys, before the flags join them
  const json flags = train::settings_from_flags(args);
  for (auto& [k, v] : flags.items()) spec.settings[k] = v;
  spec.settings.erase("attention");

  const std::string default_out = "runs/compare-" + spec.task;
  try {
    add_variants(args, attention, spec);
  } catch (const UsageError& e) {  // the file's mechanisms: the message names the file
    if (!attention_from_file) throw;
    std::string said = e.what();  // the file's value, not the flag, is what was read
    if (said.rfind("--attention: ", 0) == 0) said.erase(0, 13);
    throw UsageError(fmt::format("config file {}: setting 'attention': {}", config, said));
  }
  // a key of --config that none of the compared mechanisms reads: said (one file may serve several)
  std::vector<nn::Mechanism> mechanisms;
  for (const auto& [name, settings] : spec.variants) {
    const json& chosen = settings.contains("attention") ? settings["attention"] : spec.settings.value("attention", json());
    mechanisms.push_back(chosen.is_string() ? usage_mechanism(chosen.get<std::string>())
                                            : train::preset(spec.task).model.attention.mechanism);
  }
  cli::note_unread_config_options(config_file, mechanisms, config);
  spec.seeds = seeds_of(args.str("seeds"));
  spec.out_dir = args.is_set("out") ? args.str("out") : default_out;
  while (spec.out_dir.size() > 1 && spec.out_dir.back() == '/') spec.out_dir.pop_back();  // "CO/" names "CO/run"
  spec.overwrite = args.is_set("overwrite");
  for (const char* stem : {"results", "comparison"})  // the settings file is an input: never replaced
    for (const char* ext : {".md", ".json", ".svg"})
      files::check_not_an_input(spec.out_dir + "/" + stem + (spec.name.empty() ? "" : "-" + spec.name) + ext,
                                "comparison output", {args.str("config")});
  // a run's notes on its clusters against the sequence, as cast train says them
  spec.on_start = [](const train::TrainConfig& c, Device) { cli::note_cluster_counts_for(c.model); };
  spec.command = "cast compare";
  for (const std::string& a : argv) {
    spec.command += ' ';
    spec.command += train::shell_quote(a);
  }
  train::run_comparison(spec);  // validates every run's settings before it makes a folder
  return 0;
}

}  // namespace cast
