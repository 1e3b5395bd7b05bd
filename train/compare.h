#pragma once
// `cast compare`: the same task trained with several mechanisms (or several values of any
// setting) and seeds, each an ordinary run in its own folder under one comparison folder, then
// one results table (Markdown and JSON) and one comparison figure. Invoked again, it skips
// finished runs and resumes unfinished ones from their checkpoints.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/settings.h"

namespace cast::train {

struct CompareSpec {
  std::string task;
  std::string out_dir;  // the comparison folder
  // What differs between runs: a label ("cast", "clustering=satopk") and the settings it sets.
  std::vector<std::pair<std::string, nlohmann::json>> variants;
  std::vector<uint64_t> seeds;
  nlohmann::json settings = nlohmann::json::object();  // shared by every run (config file, then flags)
  std::string command;                                 // the command line, quoted in results.md
  // Empty: results.md, results.json, comparison.svg; else results-<name>.md and so on, so that
  // several comparisons (mechanisms; each ablation) share one folder and its runs.
  std::string name;
  bool overwrite = false;  // replace results and figures in out_dir that cast compare did not write
  // Each run's TrainConfig::on_start (its notes, as cast train prints them): set by the command.
  std::function<void(const TrainConfig&, Device)> on_start;
};

struct CompareRun {
  std::string variant, dir;
  uint64_t seed = 0;
  nlohmann::json summary;          // the run's summary.json (empty while unfinished)
  int64_t steps_this_process = 0;  // 0 for a run found finished
  bool resumed = false;            // continued from a checkpoint an earlier invocation left
};

struct CompareResult {
  std::vector<CompareRun> runs;
  bool complete = false;  // every run finished, and the table and figure written
};

// Runs what is unfinished, then writes results.md, results.json and comparison.svg into
// out_dir. A run whose settings and seed equal those of a finished run anywhere in out_dir is
// not trained again: that run is used (an ablation's baseline is the mechanism comparison's run). `stop_after` > 0
// (tests of resuming) interrupts the first unfinished run after that many steps and returns with complete = false, as a
// killed process would leave things.
CompareResult run_comparison(const CompareSpec& spec, int64_t stop_after = 0, bool quiet = false);

// A run folder's name for a variant and seed: "cast-seed1", "clustering-satopk-seed2".
std::string compare_run_name(const std::string& variant, uint64_t seed);

}  // namespace cast::train
