#pragma once
// The settings of a training run, in one table (settings.cpp). Each row is one setting: its
// name, which is at once its flag (--name), its key in a --config file and in a checkpoint's
// metadata, and the name every message uses; its kind and range or choices; its default for
// each task preset; its help line; and whether a resumed run may change it. The flags, the
// config reader, the checkpoint metadata, the validation and `cast train --help` all read it.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/transformer.h"
#include "tensor/error.h"
#include "train/cli.h"

namespace cast::train {

struct TrainConfig {
  std::string task = "listops-short";
  std::string data_dir;  // empty: the task's default
  std::string run_dir;   // empty: runs/<task>-<mechanism>
  int64_t steps = 1000, batch = 32, warmup = 100;
  int64_t log_every = 20, eval_every = 0, checkpoint_every = 200;  // eval_every 0: at the end only
  int64_t eval_limit = 0;  // evaluate on at most this many examples per split (0: all)
  double lr = 1e-3, weight_decay = 0.1, clip = 1.0, beta1 = 0.9, beta2 = 0.98, eps = 1e-9;
  std::string schedule = "cosine";  // rsqrt | cosine | constant
  uint64_t seed = 1;
  bool eval_best = false;          // evaluate the checkpoint of best validation accuracy instead of the final model
  std::string device = "auto";     // auto | cpu | cuda
  std::string precision = "fp32";  // fp32 | tf32 | bf16 (tensor/precision.h)
  bool reference = false;          // CPU: step-by-step attention ops and plain-loop matmul (for study)
  bool recompute = false;          // each block runs again in the backward (nn::ModelConfig::recompute)
  // A new run refuses a run folder that already holds a checkpoint unless this is set. Not a
  // setting of the run: it is never stored.
  bool overwrite = false;
  // `--trace`: prints (or writes) the tape of every step. Not a setting either.
  class Trace* trace = nullptr;
  // Called once the run's checks have passed and its folder is held, before the model is built
  // (`cast train`'s settings line: a refused run prints none).
  std::function<void(const TrainConfig&, Device)> on_start;
  // The command a stopped or failed run is continued with; empty: cast train --resume CHECKPOINT
  // (cast compare gives its own command: continuing one run alone would leave the others).
  std::string resume_command;
  nn::ModelConfig model;
};

enum class Kind { integer, number, word, choice, flag };
// Where a checkpoint stores a setting: with the run ("train" metadata), with the model
// ("model" metadata), or in the model's attention group ("model" → "attention").
enum class Home { run, model, attention };
// What a number setting accepts: > 0, >= 0, or [0, 1).
enum class Bound { positive, non_negative, fraction };

struct Setting {
  std::string name;
  Kind kind = Kind::integer;
  Home home = Home::run;
  std::string help;                // a choice's words follow it in --help
  int64_t lo = 0, hi = 0;          // integer: the range
  Bound bound = Bound::positive;   // number: what it accepts (always finite)
  std::vector<std::string> words;  // choice
  std::string when_empty;          // word: what an empty value means, for --help
  bool resumable = false;          // a resumed run may change it (when it stops, what it logs...)
  // The default, then the presets that differ from it: {"32", {{"image", "256"}}}.
  std::string default_text;
  std::vector<std::pair<std::string, std::string>> per_task;
  // The value in a config, as JSON; and the setter, given a value of the right kind.
  std::function<nlohmann::json(const TrainConfig&)> get;
  std::function<void(TrainConfig&, const nlohmann::json&)> set;
  // Before this table, checkpoints stored some model settings under another key, some as a
  // bool: {"mix_query", "affinity", "query"} read false as "affinity" and true as "query".
  struct OldSpelling {
    const char* key = nullptr;
    const char* if_false = nullptr;
    const char* if_true = nullptr;
  } old;
  // A model setting added after checkpoints were first written: the value a checkpoint without
  // it was trained with (nullptr: the setting must be there).
  const char* absent = nullptr;
};

// Every setting, in the order --help lists them.
const std::vector<Setting>& settings();
// The setting of that name, or nullptr.
const Setting* find_setting(const std::string& name);

// The reference settings of a task (LRA.md), or the small CPU presets.
TrainConfig preset(const std::string& task);
// What apply_overrides checks after setting: every value in its range and the settings against
// each other (`all`), or each value alone (`each`: more settings, the flags, still to come).
enum class Check { all, each };
// Sets the settings named in `j` (keys are the settings' names; "task" is skipped: it chose the
// preset). Then validate(c), or validate_each(c).
void apply_overrides(TrainConfig& c, const nlohmann::json& j, Check check = Check::all);
// Every setting within its range; a UsageError naming the setting, its value and the range.
void validate_each(const TrainConfig& c);
// validate_each, then the settings against each other ('dim' a multiple of 'heads', ...).
void validate(const TrainConfig& c);
// `message`, a usage error's, with "config file <path>: " before the first "setting 'K'" it
// names where K is a key of `file` that `flags` do not give again: a value the user put in a file
// is blamed on the file, wherever the error is found (a relation checked once the flags are in,
// a bound the data sets).
std::string naming_settings_file(const std::string& message, const nlohmann::json& file, const nlohmann::json& flags,
                                 const std::string& path);
// Called in a catch of `e`: throws it again, named with the file by naming_settings_file where
// that changes it.
[[noreturn]] void rethrow_naming_settings_file(const UsageError& e, const nlohmann::json& file,
                                               const nlohmann::json& flags, const std::string& path);
// A setting's value in `c`, as its flag would spell it (the inverse of setting_from_text).
std::string setting_value(const TrainConfig& c, const std::string& name);
// The first setting a resumed run may not change (not `resumable`) whose values in `theirs` and
// `mine` differ, as "setting 'lr' is 0.01 there but 0.001 in this run"; "" where none does (what
// the mechanism does not read is left out): whether a file is of the same run.
std::string fixed_setting_difference(const TrainConfig& theirs, const TrainConfig& mine);
// One setting's value from text ("--vary lr=1e-3,3e-3", a flag's value), typed as the setting is.
nlohmann::json setting_from_text(const std::string& name, const std::string& text);

// The settings stored with the run (the "train" metadata of a checkpoint), "task" included.
nlohmann::json run_settings_json(const TrainConfig& c);
// The model's settings and the task's sizes (the "model" metadata): the attention settings in
// an "attention" group, where the mechanism (the setting "attention") is the group's "mechanism".
nlohmann::json model_json(const nn::ModelConfig& m);
// Its inverse, strict: every field present and typed. Reads the spellings of the checkpoints
// written before this table too ("max_len", "mix_query": true, ...).
nn::ModelConfig model_from_json(const nlohmann::json& j);
// Every setting of a run: run_settings_json with the model's under "model" (for comparing runs).
nlohmann::json all_settings_json(const TrainConfig& c);
// Whether the attention `mechanism` reads the attention setting `name` (its flag: "clusters",
// "topk", ...): full attention reads no clustering setting, the clustered ones no CAST setting.
bool mechanism_reads(nn::Mechanism mechanism, const std::string& name);
// model_json and all_settings_json without the attention settings the mechanism does not read:
// two runs of full attention that differ only in --clusters are the same run, and a checkpoint of
// one resumes as the other.
nlohmann::json used_model_json(const nn::ModelConfig& m);
nlohmann::json used_settings_json(const TrainConfig& c);

// The settings as options of a command (`cast train`, `cast compare`), each help line naming
// each task's default; and the ones given on the command line, as a config file spells them.
void declare_setting_flags(cli::Args& args, const std::vector<std::string>& except);
nlohmann::json settings_from_flags(const cli::Args& args);
// A --config file: one JSON object of settings.
nlohmann::json read_settings_file(const std::string& path);
// Applies a --config file; a bad setting's message names the file.
// The task a run trains: --task, else the settings file's "task" (a file and a flag that name
// two tasks are refused); a file's task is never ignored.
std::string task_of(const std::string& task_flag, bool flag_given, const nlohmann::json& settings,
                    const std::string& path);
// The file's settings onto `c`, each value checked (a bad one named with the file); the
// relations between settings are checked once the flags are in too.
void apply_settings_file(TrainConfig& c, const nlohmann::json& settings, const std::string& path);
// The first string setting of `settings` holding a control character, said as "setting 'K' holds
// the control character \uXXXX"; "" where none does.
std::string control_character_in(const nlohmann::json& settings);

}  // namespace cast::train
