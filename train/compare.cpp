// A comparison: its runs, their resumption, the results table and the comparison figure.
// (The command, `cast compare`, is commands/compare.cpp.)
#include "train/compare.h"
#include "tensor/text.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "tensor/error.h"
#include "tensor/files.h"
#include "tensor/safetensors.h"
#include "figures/plot.h"
#include "train/stop.h"
#include "train/run_folder.h"
#include "train/tasks.h"
#include "train/trainer.h"

namespace cast::train {

using json = nlohmann::json;

std::string compare_run_name(const std::string& variant, uint64_t seed) {
  std::string name;
  for (char ch : variant) {
    if (ch == '+') continue;  // a number's sign written out (steps=+3): '-' would read as a minus
    name += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' ? ch : '-';
  }
  return fmt::format("{}-seed{}", name, seed);
}

namespace {

TrainConfig run_config(const CompareSpec& spec, const json& variant, uint64_t seed) {
  TrainConfig c = preset(spec.task);
  apply_overrides(c, spec.settings, Check::each);  // the relations are checked with the variant's settings in
  apply_overrides(c, variant, Check::each);
  apply_overrides(c, {{"seed", seed}});  // the data order, the initialisation and dropout
  return c;
}

// The run's settings as stored, without the folder (a comparison folder may be moved) and the
// attention settings its mechanism does not read (full attention's run serves any --clusters). A run
// continued in its own folder may also differ in --recompute, which changes how it computes, not
// what (bit for bit), as a resume may; a finished run taken for another variant may not, since
// `--vary recompute` compares exactly that run's time and memory.
// The data folder is compared as the folder it names, however spelled ("D", "./D", its absolute
// path, or the task's default folder left unsaid).
json comparable(const TrainConfig& c, bool with_recompute) {
  json j = used_settings_json(c);
  j.erase("run");
  if (const std::string data = data_folder(c); !data.empty()) {
    std::error_code failed;  // a working folder that is gone: compared as spelled
    std::filesystem::path resolved = std::filesystem::absolute(data, failed);
    if (!failed) resolved = std::filesystem::weakly_canonical(resolved, failed);
    j["data"] = failed ? data : resolved.string();
  }
  if (!with_recompute) j.erase("recompute");
  return j;
}

// The first key of `asked` whose value differs in `stored`, descending into objects (the
// attention's options within the model's): "attention / clusters". Empty where they agree.
std::string first_difference(const json& stored, const json& asked, json& was, json& is) {
  for (auto& [key, value] : asked.items()) {
    const json there = stored.contains(key) ? stored[key] : json();
    if (there == value) continue;
    if (value.is_object() && there.is_object()) {
      const std::string inner = first_difference(there, value, was, is);
      if (!inner.empty()) return inner;
    }
    was = there, is = value;
    return key;
  }
  return "";
}

// A run folder left by an earlier invocation must hold the run this invocation asks for. Where
// its checkpoint has the fingerprint of the set it trained on, the data is that set, compared by
// SameData, not by the folder's path: a relative path was recorded from the folder the
// comparison was started in, which need not be this one.
void check_same_run(const std::string& checkpoint, const Checkpoint& started, const TrainConfig& wanted) {
  json stored = comparable(started.config, false), asked = comparable(wanted, false);
  if (!started.data.empty()) stored.erase("data"), asked.erase("data");
  if (stored == asked) return;
  json was, is;
  // another mechanism first: the settings each reads differ with it
  const json stored_mechanism = stored["model"]["attention"]["mechanism"],
             asked_mechanism = asked["model"]["attention"]["mechanism"];
  std::string key = stored_mechanism != asked_mechanism ? "attention" : first_difference(stored, asked, was, is);
  if (key == "attention") was = stored_mechanism, is = asked_mechanism;
  if (key.empty()) key = first_difference(asked, stored, is, was);  // a key only the stored run has
  // the model's mechanism is stored as "mechanism": named as the setting (and flag) 'attention'
  if (key == "model / mechanism" || key == "mechanism") key = "attention";
  throw UsageError(fmt::format("{}: this run was started with setting '{}' = {}, but this comparison asks for {}; use "
                               "another --out, or the settings it was started with",
                               checkpoint, key, files::json_excerpt(was), files::json_excerpt(is)));
}

// A finished run folder under `out_dir` trained with exactly `config` (seed included), or "".
std::string finished_run_like(const std::string& out_dir, const TrainConfig& config) {
  const json wanted = comparable(config, true);
  std::vector<std::filesystem::path> folders;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir))
    if (entry.is_directory()) folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  for (const auto& folder : folders) {
    const std::string checkpoint = (folder / "checkpoint.safetensors").string();
    if (!std::filesystem::exists(folder / "summary.json") || !std::filesystem::exists(checkpoint)) continue;
    if (comparable(read_checkpoint_header(checkpoint).config, true) == wanted) return folder.string();
  }
  return "";
}

// A run's summary.json, checked key by key against what cast train writes for this run's
// settings, so an edited or damaged file is one error naming the file and the key, never a wrong
// table.
json read_summary(const std::string& path, const TrainConfig& config) {
  const json j = files::read_json(path, "run summary");
  const std::string fix = "delete it to let the run finish again";
  CAST_CHECK(j.is_object(), "run summary {}: not a JSON object ({})", path, fix);
  auto number = [&](const char* key, double lo, double hi, bool required) {
    if (!j.contains(key)) {
      CAST_CHECK(!required, "run summary {}: '{}' is missing ({})", path, key, fix);
      return;
    }
    CAST_CHECK(j[key].is_number(), "run summary {}: '{}' is {}, not a number ({})", path, key,
               files::json_excerpt(j[key]), fix);
    const double v = j[key].get<double>();
    CAST_CHECK(std::isfinite(v) && v >= lo && v <= hi, "run summary {}: '{}' is {}, outside [{}, {}] ({})", path, key,
               files::json_excerpt(j[key]), lo, hi, fix);
  };
  auto whole = [&](const char* key, int64_t lo, int64_t hi, bool required) {
    if (!j.contains(key) && !required) return;
    CAST_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= lo &&
                   j[key].get<int64_t>() <= hi,
               "run summary {}: '{}' is {}, not a whole number from {} to {} ({})", path, key,
               files::json_excerpt(j.value(key, json())), lo, hi, fix);
  };
  auto word = [&](const char* key, const std::vector<std::string>& allowed, bool required) {
    if (!j.contains(key) && !required) return;
    const bool ok = j.contains(key) && j[key].is_string() &&
                    std::find(allowed.begin(), allowed.end(), j[key].get<std::string>()) != allowed.end();
    CAST_CHECK(ok, "run summary {}: '{}' is {}, not {} ({})", path, key, files::json_excerpt(j.value(key, json())),
               fmt::join(allowed, " or "), fix);
  };
  const std::set<std::string> keys = {"task",          "attention",     "steps",         "seconds",
                                      "step_seconds",  "peak_bytes",    "device",        "val_accuracy",
                                      "test_accuracy", "val_examples",  "test_examples", "majority_rate",
                                      "evaluated",     "evaluated_step", "made_by",       "digest",
                                      "run_id"};
  for (const auto& [key, value] : j.items())
    CAST_CHECK(keys.count(key), "run summary {}: '{}' is no key of a summary cast train writes ({})", path,
               visible(key), fix);
  word("made_by", {"cast train"}, false);  // summaries written before the mark lack it
  CAST_CHECK(!j.contains("run_id") || (j["run_id"].is_string() && text::is_run_id(j["run_id"].get<std::string>())),
             "run summary {}: 'run_id' is {}, not a run id (16 lowercase hexadecimal digits) ({})", path,
             files::json_excerpt(j["run_id"]), fix);
  word("task", {config.task}, false);
  word("attention", {nn::mechanism_name(config.model.attention.mechanism)}, false);
  word("device", {"cpu", "cuda"}, false);
  word("evaluated", {"final", "best"}, false);
  number("test_accuracy", 0, 1, true);
  number("val_accuracy", 0, 1, true);
  number("majority_rate", 0, 1, false);
  number("seconds", 0, 1e12, false);
  number("step_seconds", 0, 1e12, false);
  number("peak_bytes", 0, 1e18, false);
  whole("steps", 0, config.steps, true);
  whole("evaluated_step", 0, j["steps"].get<int64_t>(), false);
  whole("val_examples", 0, INT64_MAX, false);
  whole("test_examples", 0, INT64_MAX, false);
  // values edited within their ranges would make a wrong table: the digest tells (summaries
  // written before digests have none)
  CAST_CHECK(files::digest_matches(files::read_file(path, "run summary")),
             "run summary {}: was changed since cast train wrote it (its digest no longer matches) ({})", path, fix);
  return j;
}

struct Stats {
  double mean = 0, sd = 0;  // sd: sample standard deviation, 0 for one run
  int n = 0;
};
Stats stats(const std::vector<double>& xs) {
  Stats s;
  s.n = static_cast<int>(xs.size());
  if (xs.empty()) return s;
  for (double x : xs) s.mean += x / xs.size();
  if (xs.size() > 1) {
    double ss = 0;
    for (double x : xs) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / (xs.size() - 1));
  }
  return s;
}

std::string percent(const Stats& s) {
  return s.n > 1 ? fmt::format("{:.2f} ± {:.2f}", 100 * s.mean, 100 * s.sd) : fmt::format("{:.2f}", 100 * s.mean);
}

std::string duration(double seconds) {
  if (seconds < 60) return fmt::format("{:.1f} s", seconds);
  const int64_t s = std::llround(seconds);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}m{:02}s", s / 60, s % 60);
}

// The curves of a variant's runs, averaged over seeds at the steps every run logged.
Curves mean_curves(const std::string& label, const std::vector<Curves>& runs) {
  Curves mean;
  mean.label = runs.size() > 1 ? fmt::format("{} (mean of {} seeds)", label, runs.size()) : label;
  auto average = [&](auto steps_of, auto values_of, std::vector<double>& steps_out, std::vector<double>& values_out) {
    const std::vector<double>& steps = steps_of(runs[0]);
    for (size_t i = 0; i < steps.size(); ++i) {
      if (i > 0 && steps[i] == steps[i - 1]) continue;  // the final validation repeats the last periodic one
      double sum = 0;
      bool everywhere = true;
      for (const Curves& r : runs) {
        const auto& s = steps_of(r);
        auto at = std::find(s.begin(), s.end(), steps[i]);
        if (at == s.end()) {
          everywhere = false;
          break;
        }
        sum += values_of(r)[static_cast<size_t>(at - s.begin())];
      }
      if (!everywhere) continue;
      steps_out.push_back(steps[i]);
      values_out.push_back(sum / runs.size());
    }
  };
  average([](const Curves& c) -> const std::vector<double>& { return c.steps; },
          [](const Curves& c) -> const std::vector<double>& { return c.loss; }, mean.steps, mean.loss);
  average([](const Curves& c) -> const std::vector<double>& { return c.val_steps; },
          [](const Curves& c) -> const std::vector<double>& { return c.val_accuracy; }, mean.val_steps,
          mean.val_accuracy);
  return mean;
}

std::string output_name(const CompareSpec& spec, const std::string& stem, const std::string& extension) {
  return spec.name.empty() ? stem + extension : stem + "-" + spec.name + extension;
}

// results.md down to its table of variants' header row.
std::string results_heading(const CompareSpec& spec) {
  std::string md = fmt::format("# Comparison: {}\n\n<!-- {} -->\n\n", spec.task, files::kDigestSlot);
  if (!spec.command.empty()) md += fmt::format("Command: `{}`\n\n", spec.command);
  md += fmt::format(
      "Test and validation accuracy: mean ± sample standard deviation over seeds ({}). Wall time is "
      "per run, steps, evaluations and checkpoints included; step time is the mean training step; "
      "peak memory is the most that tensors held at once.\n\n",
      fmt::join(spec.seeds, ", "));
  md +=
      "| variant | runs | test accuracy % | validation accuracy % | steps | wall time per run | step ms | peak MiB |\n"
      "|---|---|---|---|---|---|---|---|\n";
  return md;
}

// results.md's table of every run.
std::string runs_table(const std::vector<CompareRun>& runs) {
  std::string md =
      "\n## Runs\n\n| variant | seed | folder | test % | validation % | majority % | steps | wall time | step ms |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const CompareRun& r : runs) {
    const json& s = r.summary;
    md +=
        fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {} | {} | {:.1f} |\n", r.variant, r.seed,
                    std::filesystem::path(r.dir).filename().string(), 100 * s["test_accuracy"].get<double>(),
                    100 * s["val_accuracy"].get<double>(), 100 * s.value("majority_rate", 0.0),
                    s["steps"].get<int64_t>(), duration(s.value("seconds", 0.0)), 1000 * s.value("step_seconds", 0.0));
  }
  return md;
}

void write_results(const CompareSpec& spec, const std::vector<CompareRun>& runs) {
  json variants = json::array();
  std::string md = results_heading(spec);
  std::vector<Curves> figure;
  for (const auto& [label, settings] : spec.variants) {
    std::vector<double> test, val, wall, step_ms;
    double peak = 0;
    int64_t steps = 0;
    std::vector<Curves> curves;
    json run_rows = json::array();
    for (const CompareRun& r : runs) {
      if (r.variant != label) continue;
      const json& s = r.summary;
      test.push_back(s["test_accuracy"].get<double>());
      val.push_back(s["val_accuracy"].get<double>());
      wall.push_back(s.value("seconds", 0.0));
      step_ms.push_back(1000 * s.value("step_seconds", 0.0));
      peak = std::max(peak, s.value("peak_bytes", 0.0) / (1 << 20));
      steps = s["steps"].get<int64_t>();
      curves.push_back(read_curves(r.dir));
      run_rows.push_back(
          {{"seed", r.seed}, {"folder", std::filesystem::path(r.dir).filename().string()}, {"summary", s}});
    }
    const Stats t = stats(test), v = stats(val), w = stats(wall), ms = stats(step_ms);
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {:.1f} | {:.1f} |\n", label, t.n, percent(t), percent(v), steps,
                      duration(w.mean), ms.mean, peak);
    variants.push_back({{"variant", label},
                        {"settings", settings},
                        {"runs", run_rows},
                        {"test_accuracy", {{"mean", t.mean}, {"sd", t.sd}}},
                        {"val_accuracy", {{"mean", v.mean}, {"sd", v.sd}}},
                        {"steps", steps},
                        {"wall_seconds_mean", w.mean},
                        {"step_ms_mean", ms.mean},
                        {"peak_mib", peak}});
    figure.push_back(mean_curves(label, curves));
  }
  md += runs_table(runs);
  md += fmt::format("\n![validation accuracy and training loss of every variant]({})\n",
                    output_name(spec, "comparison", ".svg"));
  const json results = {{"made_by", "cast compare"},  // the mark: what a later comparison may replace
                        {"digest", files::kDigestSlot},  // that nobody changed it since
                        {"task", spec.task},         {"seeds", spec.seeds}, {"settings", spec.settings},
                        {"command", spec.command},   {"variants", variants}};
  files::write_stamped(spec.out_dir + "/" + output_name(spec, "results", ".md"), md, "comparison results",
                      files::Link::refuse);
  std::vector<std::string> labels;
  for (const auto& v : spec.variants) labels.push_back(v.first);
  plot_comparison(spec.out_dir + "/" + output_name(spec, "comparison", ".svg"),
                  fmt::format("{}: {} ({} seed{})", spec.task, fmt::join(labels, ", "), spec.seeds.size(),
                              spec.seeds.size() == 1 ? "" : "s"),
                  figure, files::Link::refuse);
  files::write_stamped(spec.out_dir + "/" + output_name(spec, "results", ".json"), results.dump(2) + "\n",
                      "comparison results", files::Link::refuse);
}

// results.md, results.json and comparison.svg replace only what an earlier comparison wrote and
// nobody changed since, by their digests (or anything, with --overwrite): checked before the first
// step is spent.
void check_outputs_may_be_replaced(const CompareSpec& spec) {
  const std::string md = output_name(spec, "results", ".md"), js = output_name(spec, "results", ".json");
  files::check_may_replace(spec.out_dir + "/" + md, "comparison output", "the results of cast compare",
                           "# Comparison: ", spec.overwrite);
  files::check_may_replace(spec.out_dir + "/" + js, "comparison output", "the results of cast compare",
                           "\"made_by\": \"cast compare\"", spec.overwrite);
  files::check_may_replace(spec.out_dir + "/" + output_name(spec, "comparison", ".svg"), "comparison output",
                           "a figure drawn by cast", files::kFigureMark, spec.overwrite);
  // written without following a link, at the end: a link there is refused now, before any run
  if (files::exists(spec.out_dir))
    for (const std::string& name : {md, js, output_name(spec, "comparison", ".svg")})
      files::output_target(spec.out_dir + "/" + name, "comparison output", files::Link::refuse);
}

// The command that continues an interrupted comparison: the same one.
std::string resume_command(const CompareSpec& spec) {
  return spec.command.empty() ? "the same cast compare command again" : spec.command;
}

// One run of the comparison; a stop request (Ctrl-C) ends the comparison after the run's
// current step, with its checkpoint written and every other run as it was: all resumable.
TrainResult run_training_or_stop(const CompareSpec& spec, const TrainConfig& config, const std::string& resume_from,
                                 int64_t stop_after, bool quiet) {
  try {
    TrainConfig c = config;
    c.resume_command = resume_command(spec);  // a run continued alone would leave the comparison unfinished
    return run_training(c, resume_from, stop_after, quiet);
  } catch (const Interrupted& e) {
    throw Interrupted(e.signal(), e.what_happened(), resume_command(spec));
  }
}

// A run's failure names the run (its variant, seed and folder) on the error line itself, which
// may be all a user sees of a long comparison (stdout sent elsewhere). A stop stays as it is.
template <class Fn>
TrainResult run_naming_it(const std::string& progress, const std::string& dir, Fn&& fn) {
  try {
    return fn();
  } catch (const Stopped&) {
    throw;
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{} ({}): {}", progress, dir, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{} ({}): {}", progress, dir, e.what()));
  }
}

// A run's settings as the model runs them, for telling two variants apart: the folder left out,
// a cluster count of 0 (the default) resolved at the longest sequence's tokens, and the device
// `auto` resolved to the one this machine gives it.
std::string resolved_settings(TrainConfig c) {
  c.run_dir.clear();
  c.device = device_name(resolve_device(c.device, false));
  c.model.attention.clusters = c.model.cluster_count();
  return comparable(c, true).dump();
}

// A data set as one run reads it: its task's loader on its folder, cut to its --max-len (a --vary
// max-len reads one folder two ways).
std::string set_as_read(const TrainConfig& c) {
  return fmt::format("{}\n{}\n{}", c.task, data_folder(c), c.model.max_len);
}

// Every run still to train, against its data: what its start would refuse (a data file that does
// not read, a split with no examples, a step beyond the device's memory) is refused before the
// comparison's folder is made and before its first run trains. Each data folder is read once
// here; a task's default folder not made yet is made and checked when its run starts.
void check_runs_fit(const CompareSpec& spec, const std::vector<std::pair<CompareRun, TrainConfig>>& plan) {
  std::map<std::string, data::TaskData> read;  // by set_as_read
  for (const auto& planned : plan) {
    const CompareRun& run = planned.first;  // not a structured binding, which clang 14's lambdas cannot capture
    const TrainConfig& config = planned.second;
    if (files::exists(run.dir + "/summary.json")) continue;  // finished earlier
    const std::string folder = data_folder(config);
    if (config.data_dir.empty() && !std::filesystem::exists(folder)) continue;
    const auto named = [&](const Error& e) {
      return spec.variants.size() == 1 ? std::string(e.what()) : fmt::format("variant {}: {}", run.variant, e.what());
    };
    try {
      auto it = read.find(set_as_read(config));
      if (it == read.end()) it = read.emplace(set_as_read(config), load_task(config, false)).first;
      check_run_fits(config, it->second);
    } catch (const UsageError& e) {
      throw UsageError(named(e));
    } catch (const Stopped&) {
      throw;
    } catch (const Error& e) {
      throw Error(named(e));
    }
  }
}

// Every run's folder and settings, checked before the first step is spent.
std::vector<std::pair<CompareRun, TrainConfig>> plan_runs(const CompareSpec& spec) {
  std::vector<std::pair<CompareRun, TrainConfig>> plan;
  for (const auto& [label, settings] : spec.variants)
    for (uint64_t seed : spec.seeds) {
      CompareRun r;
      r.variant = label;
      r.seed = seed;
      r.dir = spec.out_dir + "/" + compare_run_name(label, seed);
      TrainConfig c;
      try {  // the variant's settings against the shared ones and the sequence: named
        c = run_config(spec, settings, seed);
        check_clusters_fit(c.model, c.model.max_len);
      } catch (const UsageError& e) {
        if (spec.variants.size() == 1) throw;  // one run's settings: nothing to tell apart
        throw UsageError(fmt::format("variant {}: {}", label, e.what()));
      }
      // a value spelled into the folder's name (--vary data=<a long path>) may make it too long
      files::check_name_fits(r.dir, spec.variants.size() == 1 ? "run folder" : "variant " + label + ": run folder",
                             std::string("/checkpoint.safetensors").size());
      c.run_dir = r.dir;
      c.on_start = spec.on_start;
      // what can be told before any run starts: two variants in one folder, more clusters than
      // the longest sequence's tokens, a data folder that is not there
      for (const auto& [planned, other] : plan) {
        CAST_CHECK_USAGE(planned.dir != r.dir, "--vary: the variants '{}' and '{}' would share the run folder {}",
                         planned.variant, r.variant, r.dir);
        // two spellings of one run (clusters=0,8 where the default is 8 clusters): trained twice
        CAST_CHECK_USAGE(planned.seed != r.seed || resolved_settings(other) != resolved_settings(c),
                         "--vary: the variants '{}' and '{}' train the same run (their settings agree once a default "
                         "is resolved, a cluster count of 0 at the model's sequence and the device auto on this "
                         "machine, and what the mechanism does not read is left out); list it once",
                         planned.variant, r.variant);
      }
      // what each run's start would refuse, refused before the first run trains
      CAST_CHECK_USAGE(!c.eval_best || c.eval_every > 0,
                       "variant {}: setting 'eval-best' needs 'eval-every' above 0: the best checkpoint is chosen at "
                       "the validations during training",
                       r.variant);
      CAST_CHECK_USAGE(resolve_device(c.device, false) == Device::cuda || c.precision == "fp32",
                       "variant {}: setting 'precision' is {}: the CPU computes in fp32 only (tf32 and bf16 need "
                       "--device cuda)",
                       r.variant, c.precision);
      files::check_output_folder(r.dir, "run folder");  // a file where a run's folder goes: refused before any run
      if (std::filesystem::is_directory(r.dir) && !files::exists(r.dir + "/checkpoint.safetensors"))
        check_new_run_files(c);
      // nothing is made inside the data a run reads, the comparison's lock file included
      files::check_not_inside(spec.out_dir, "comparison folder", data_folder(c), "data folder");
      if (!c.data_dir.empty())  // a task's default folder may be generated when the run starts
        files::require_folder(c.data_dir, fmt::format("data folder of variant {}:", r.variant));
      plan.push_back({r, c});
    }
  return plan;
}

// A run kept from an earlier invocation trained on the set its data folder holds now: a table
// never mixes runs of two sets. Each folder's set is read once.
class SameData {
 public:
  void check(const std::string& checkpoint, const Checkpoint& stored, const TrainConfig& config) {
    if (stored.data.empty()) return;  // a checkpoint from before fingerprints
    const std::string folder = data_folder(config);
    auto it = now_.find(set_as_read(config));
    if (it == now_.end()) it = now_.emplace(set_as_read(config), data::fingerprint(load_task(config, false))).first;
    CAST_CHECK_USAGE(stored.data == it->second,
                     "{}: this run trained on another set than data folder {} now holds ({}; now {}); use another "
                     "--out, or the set it trained on",
                     checkpoint, folder, stored.data, it->second);
  }

 private:
  std::map<std::string, std::string> now_;  // set_as_read -> the fingerprint of the set
};

// A run not started in its own folder that another finished run of the comparison already is
// (same settings): it takes that run's folder and summary. `progress` is printed when not empty.
bool reuse_finished_run(const CompareSpec& spec, const TrainConfig& config, CompareRun& run,
                        const std::string& progress, SameData& same_data) {
  const std::string same = finished_run_like(spec.out_dir, config);
  if (same.empty()) return false;
  same_data.check(same + "/checkpoint.safetensors", read_checkpoint_header(same + "/checkpoint.safetensors"), config);
  check_records_are_the_runs(same + "/checkpoint.safetensors", same, true);
  run.dir = same;
  run.summary = read_summary(same + "/summary.json", config);
  if (!progress.empty()) fmt::print("{}: the same settings as the finished run {}; using it\n", progress, same);
  return true;
}

}  // namespace

CompareResult run_comparison(const CompareSpec& spec, int64_t stop_after, bool quiet) {
  CAST_CHECK(!spec.variants.empty() && !spec.seeds.empty(), "a comparison needs at least one variant and one seed");
  CAST_CHECK_USAGE(
      !spec.settings.contains("run") && !spec.settings.contains("seed"),
      "cast compare chooses each run's folder and seed: use --out and --seeds instead of --run and --seed");
  files::check_name_fits(spec.out_dir, "comparison folder");
  files::check_output_folder(spec.out_dir, "comparison folder");  // a file, FIFO or dangling link: said as such
  check_not_in_a_data_set(spec.out_dir, "comparison folder", "--out");  // before its first run, not inside it
  // a run's folder is the run's: a comparison there would take its place as a run folder
  for (const char* theirs : {"/checkpoint.safetensors", "/summary.json"})
    CAST_CHECK_USAGE(!files::exists(spec.out_dir + theirs) || files::exists(spec.out_dir + "/results.json"),
                     "comparison folder {}: holds a run ({}): choose another --out", spec.out_dir, spec.out_dir + theirs);
  std::vector<std::pair<CompareRun, TrainConfig>> plan = plan_runs(spec);
  check_outputs_may_be_replaced(spec);  // reads only: a refusal leaves the folder as it was
  // a run an earlier invocation left that this comparison's settings do not match: refused before
  // the folder is locked, so that the refusal changes nothing (its lock file was left behind)
  {
    SameData same_data;
    for (const auto& [run, config] : plan) {
      const std::string checkpoint = run.dir + "/checkpoint.safetensors";
      if (!std::filesystem::exists(checkpoint)) continue;
      const Checkpoint stored = read_checkpoint_header(checkpoint);
      check_same_run(checkpoint, stored, config);
      same_data.check(checkpoint, stored, config);
      // a finished run is reported as it lies: its records and summary are its checkpoint's run's
      if (std::filesystem::exists(run.dir + "/summary.json")) check_records_are_the_runs(checkpoint, run.dir, true);
    }
  }
  check_runs_fit(spec, plan);
  files::make_writable_folder(spec.out_dir, "comparison folder");
  const files::FolderLock held(spec.out_dir, "comparison folder");  // one comparison in it at a time
  CompareResult result;
  SameData same_data;
  int index = 0;
  for (auto& [run, config] : plan) {
    ++index;
    const std::string checkpoint = run.dir + "/checkpoint.safetensors", summary = run.dir + "/summary.json";
    const bool started = std::filesystem::exists(checkpoint);
    const std::string progress = fmt::format("[{}/{}] {} seed {}", index, plan.size(), run.variant, run.seed);
    if (!started && reuse_finished_run(spec, config, run, quiet ? "" : progress, same_data)) {
      result.runs.push_back(run);
      continue;
    }
    Checkpoint stored;  // what an earlier invocation left, read once
    if (started) {
      stored = read_checkpoint_header(checkpoint);
      check_same_run(checkpoint, stored, config);
      same_data.check(checkpoint, stored, config);
    }
    if (started && std::filesystem::exists(summary)) {
      run.summary = read_summary(summary, config);
      if (!quiet) fmt::print("{}: finished earlier ({})\n", progress, run.dir);
      result.runs.push_back(run);
      continue;
    }
    if (!quiet) {
      if (started) fmt::print("{}: resuming from step {} of {} ({})\n", progress, stored.step, config.steps, run.dir);
      else fmt::print("{}: {} steps ({})\n", progress, config.steps, run.dir);
      std::fflush(stdout);
    }
    // A resumed run's checkpoint holds these very settings (checked above).
    const TrainConfig& this_run = config;  // a structured binding, which clang 14 cannot capture
    const TrainResult r = run_naming_it(progress, run.dir, [&] {
      return run_training_or_stop(spec, this_run, started ? checkpoint : "", stop_after, quiet);
    });
    run.resumed = started;
    run.steps_this_process = static_cast<int64_t>(r.losses.size());
    if (!std::filesystem::exists(summary)) {  // interrupted (tests): what a killed process leaves
      result.runs.push_back(run);
      return result;
    }
    run.summary = read_summary(summary, config);
    result.runs.push_back(run);
  }
  write_results(spec, result.runs);
  result.complete = true;
  if (!quiet)
    fmt::print("cast compare: {} runs -> {}/{}, {}, {}\n", result.runs.size(), spec.out_dir,
               output_name(spec, "results", ".md"), output_name(spec, "results", ".json"),
               output_name(spec, "comparison", ".svg"));
  return result;
}

}  // namespace cast::train
