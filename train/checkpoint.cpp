#include "train/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <tuple>
#include <filesystem>
#include <random>

#include "tensor/files.h"
#include "tensor/safetensors.h"
#include "tensor/text.h"
#include "train/tasks.h"
#include "train/trainer.h"  // check_clusters_fit

namespace cast::train {

using json = nlohmann::json;

static const char* kFormat = "cast-checkpoint-1";
// Every key of a checkpoint's metadata (save_checkpoint writes them; 'data' where the set is known).
static const std::set<std::string> kMetadataKeys = {
    "format",      "model",       "train",        "step",       "rng_offset", "clustering_draws",
    "best_val",    "wall_seconds", "step_seconds", "peak_bytes", "log_window", "data",
    "run_id",      "best_step"};

std::string run_id_of(const Checkpoint& ck) {
  if (!ck.run_id.empty()) return ck.run_id;
  const std::string text = run_settings_json(ck.config).dump() + '\n' + model_json(ck.config.model).dump() + '\n' +
                           std::to_string(ck.step) + '\n' + std::to_string(ck.rng_offset);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (const unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", hash);
}

std::string new_run_id() {
  std::random_device source;
  const uint64_t id = (static_cast<uint64_t>(source()) << 32) ^ source();
  return fmt::format("{:016x}", id);
}


// ---------------------------------------------------------------- finite values
std::string non_finite_in(const std::map<std::string, Tensor>& tensors) {
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;  // a structured binding cannot be captured by clang 14
    const Tensor& t = entry.second;
    const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
    auto scan = [&](const auto* x) -> std::string {
      for (int64_t i = 0; i < host.numel(); ++i)
        if (!std::isfinite(x[i]))
          return fmt::format("'{}' holds {} at element {}", name,
                             std::isnan(x[i]) ? "nan"
                             : x[i] > 0       ? "inf"
                                              : "-inf",
                             i);
      return "";
    };
    std::string found;
    if (host.dtype() == DType::f32) found = scan(host.data<float>());
    else if (host.dtype() == DType::f64) found = scan(host.data<double>());
    if (!found.empty()) return found;
  }
  return "";
}

std::string checkpoint_damage(const std::string& path) {
  return non_finite_in(read_safetensors(path, "checkpoint").tensors);
}

std::string no_checkpoint_at(const std::string& path) {
  const std::string folder = std::filesystem::path(path).parent_path().string();
  if (!folder.empty() && !files::exists(folder))
    return fmt::format("The run folder {} is gone (moved or removed while the run went on), its checkpoints with it",
                       folder);
  return "No checkpoint was written yet";
}

std::string last_good_checkpoint(const std::string& path, bool* usable) {
  if (usable) *usable = false;
  if (!files::exists(path)) {
    // the best checkpoint a validation wrote before the run's first own one is a good model too
    const std::string best = (std::filesystem::path(path).parent_path() / "best.safetensors").string();
    if (path != best && files::exists(best)) {
      try {
        if (checkpoint_damage(best).empty())
          return fmt::format("No {} was written yet; the best validation's {} (step {}, every value checked finite) "
                             "is the last good model",
                             std::filesystem::path(path).filename().string(), best, read_checkpoint_header(best).step);
      } catch (const Error&) {  // unreadable: no good model to name
      }
    }
    return no_checkpoint_at(path);
  }
  try {
    const Checkpoint ck = read_checkpoint_header(path);
    const std::string damage = checkpoint_damage(path);
    if (usable) *usable = damage.empty();
    if (damage.empty())
      return fmt::format("The last good checkpoint is {} (step {}, every value checked finite)", path, ck.step);
    return fmt::format("{} holds non-finite values ({}): no good checkpoint is left", path, damage);
  } catch (const Error& e) {
    return fmt::format("{} cannot be read back ({}): no good checkpoint is left", path, e.what());
  }
}

// ---------------------------------------------------------------- writing
void save_checkpoint(const std::string& path, const TrainConfig& c, nn::Transformer& model,
                     const std::vector<Tensor>& m, const std::vector<Tensor>& v, int64_t step, double best_val,
                     const RunCost& cost, const LogWindow& window, const std::string& data,
                     const std::string& run_id, int64_t best_step) {
  std::map<std::string, Tensor> tensors;
  nn::ParamList params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    tensors["param/" + params[i].first] = *params[i].second;
    if (!m.empty()) {
      tensors["adam.m/" + params[i].first] = m[i];
      tensors["adam.v/" + params[i].first] = v[i];
    }
  }
  std::map<std::string, std::string> meta = {{"format", kFormat},
                                             {"model", model_json(c.model).dump()},
                                             {"train", run_settings_json(c).dump()},
                                             {"step", std::to_string(step)},
                                             {"rng_offset", std::to_string(model.rng_offset)},
                                             {"clustering_draws",
                                              fmt::format("{}", fmt::join(model.clustering_draws(), ","))},
                                             {"best_val", fmt::format("{:.17g}", best_val)},
                                             {"wall_seconds", fmt::format("{:.17g}", cost.wall_seconds)},
                                             {"step_seconds", fmt::format("{:.17g}", cost.step_seconds)},
                                             {"peak_bytes", std::to_string(cost.peak_bytes)},
                                             {"log_window", fmt::format("{:.17g},{:.17g},{:.17g},{:.17g}", window.loss,
                                                                        window.correct, window.examples,
                                                                        window.tokens)}};
  if (!data.empty()) meta["data"] = data;
  if (!run_id.empty()) meta["run_id"] = run_id;
  if (best_step >= 0) meta["best_step"] = std::to_string(best_step);
  // A checkpoint is only ever written finite, so the one on disk is always a good one.
  const std::string damage = non_finite_in(tensors);
  if (!damage.empty()) throw NonFiniteCheckpoint(fmt::format("{}: not written: {}", path, damage));
  write_safetensors(path, tensors, meta, "checkpoint", files::Link::refuse);
}

// ---------------------------------------------------------------- reading
// "loss,correct,examples,tokens": four finite sums, none negative but the loss's.
static LogWindow log_window_of(const std::string& text) {
  std::vector<double> sums;
  size_t begin = 0;
  while (sums.size() < 5) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string part = text.substr(begin, comma - begin);
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(part, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    CAST_CHECK(!part.empty() && used == part.size() && std::isfinite(value),
               "'log_window' is '{}', not four finite numbers", text);
    sums.push_back(value);
    if (comma == text.size()) break;
    begin = comma + 1;
  }
  CAST_CHECK(sums.size() == 4 && sums[1] >= 0 && sums[2] >= 0 && sums[3] >= 0 && sums[1] <= sums[2],
             "'log_window' is '{}', not four finite sums (loss, correct, examples, tokens)", text);
  return {sums[0], sums[1], sums[2], sums[3]};
}

// A counter of the metadata (`key`), whole and digits only: stoull alone reads "-1" as
// 18446744073709551615.
static uint64_t counter_of(const std::string& text, const char* key = "rng_offset") {
  try {
    size_t used = 0;
    if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
      const uint64_t offset = std::stoull(text, &used);
      if (used == text.size()) return offset;
    }
  } catch (const std::out_of_range&) {
  }
  throw Error(fmt::format("'{}' is '{}', not a number in range", key, text));
}

// "3,3" -> {3, 3}: one count per layer. Checkpoints written before it was kept have none: zeros.
static std::vector<uint64_t> clustering_draws_of(const std::string& text, size_t layers) {
  std::vector<uint64_t> draws;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    draws.push_back(counter_of(text.substr(begin, comma - begin), "clustering_draws"));
    begin = comma + 1;
  }
  if (draws.size() != layers)
    throw Error(fmt::format("'clustering_draws' holds {} counts, but the model has {} layers", draws.size(), layers));
  return draws;
}

Checkpoint read_checkpoint_header(const std::string& path) {
  TensorFile f = read_safetensors(path, "checkpoint");
  auto get = [&](const char* key) {
    auto it = f.metadata.find(key);
    CAST_CHECK(it != f.metadata.end(), "{}: not a cast checkpoint (no '{}' metadata)", path, key);
    return it->second;
  };
  CAST_CHECK(get("format") == kFormat, "{}: unsupported checkpoint format '{}'", path, get("format"));
  // missing: said once, not inside a "corrupt metadata" message
  for (const char* key : {"train", "model", "step", "rng_offset", "best_val"}) get(key);
  // the run's cost is written whole or (before it was kept) not at all
  const size_t cost_keys = f.metadata.count("wall_seconds") + f.metadata.count("step_seconds") +
                           f.metadata.count("peak_bytes");
  CAST_CHECK(cost_keys == 0 || cost_keys == 3,
             "{}: corrupt checkpoint metadata: 'wall_seconds', 'step_seconds' and 'peak_bytes' are kept together, "
             "but it holds {} of them",
             path, cost_keys);
  // a key cast train never writes would be dropped by the next checkpoint without a word
  for (const auto& [key, value] : f.metadata)
    CAST_CHECK(kMetadataKeys.count(key), "{}: metadata key {} is none that cast train writes ({})", path,
               files::json_excerpt(json(key)), fmt::join(kMetadataKeys, ", "));
  Checkpoint ck;
  try {
    json train = files::parse_json(get("train"), "'train' metadata");
    CAST_CHECK(train.is_object(), "'train' metadata is {}, not a JSON object of settings", train.type_name());
    CAST_CHECK(train.contains("task") && train.at("task").is_string(),
               "'train' metadata: 'task' is missing or not a string");
    if (train.is_object() && train.contains("tf32") && !train.contains("precision")) {
      // written before `precision`: its flag `tf32` (which the CPU ignored) is precision tf32 on
      // a GPU run, fp32 on a CPU run
      const bool on_cpu = train.contains("device") && train.at("device") == json("cpu");
      train["precision"] = train.at("tf32") == json(true) && !on_cpu ? "tf32" : "fp32";
      train.erase("tf32");
    }
    const std::string control = control_character_in(train);  // it would break every message naming it
    CAST_CHECK(control.empty(), "'train' metadata: {}", control);
    ck.config.task = train.at("task").get<std::string>();
    apply_overrides(ck.config, train);
    ck.config.model = model_from_json(files::parse_json(get("model"), "'model' metadata"));
    validate(ck.config);  // a checkpoint's sizes are input too: `layers: 1000000` is refused here
    // as training refuses them: more clusters than a sequence's tokens are an edited file's
    check_clusters_fit(ck.config.model, ck.config.model.max_len);
    // whole-string numbers: "12oops" is no step; the parser's own words ("stoll") never reach a message
    auto whole = [&](const char* key, auto parse) {
      const std::string text = get(key);
      size_t used = 0;
      try {
        // as cast writes it: no space or '+' before it, which the parser would skip
        const bool plain = !text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) && text[0] != '+';
        const auto value = parse(text, &used);
        if (plain && used == text.size()) return value;
      } catch (const std::logic_error&) {  // not a number, or out of range
      }
      throw Error(fmt::format("'{}' is '{}', not a number in range", key, text));
    };
    ck.step = whole("step", [](const std::string& t, size_t* u) { return std::stoll(t, u); });
    ck.rng_offset = counter_of(get("rng_offset"));
    ck.best_val = whole("best_val", [](const std::string& t, size_t* u) { return std::stod(t, u); });
    CAST_CHECK(ck.best_val == -1 || (ck.best_val >= 0 && ck.best_val <= 1),
               "'best_val' is {}: an accuracy in [0, 1], or -1 before the first validation", ck.best_val);
    if (f.metadata.count("wall_seconds")) {
      ck.cost.wall_seconds = whole("wall_seconds", [](const std::string& t, size_t* u) { return std::stod(t, u); });
      ck.cost.step_seconds = whole("step_seconds", [](const std::string& t, size_t* u) { return std::stod(t, u); });
      ck.cost.peak_bytes = whole("peak_bytes", [](const std::string& t, size_t* u) { return std::stoll(t, u); });
      // the bounds a run's summary.json is read with (train/compare.cpp): what a checkpoint
      // carries into its run's summary must be a value its reader takes
      for (const auto& [key, value, most] :
           {std::tuple<const char*, double, double>{"wall_seconds", ck.cost.wall_seconds, 1e12},
            {"step_seconds", ck.cost.step_seconds, 1e12},
            {"peak_bytes", static_cast<double>(ck.cost.peak_bytes), 1e18}})
        CAST_CHECK(std::isfinite(value) && value >= 0 && value <= most,
                   "'{}' is '{}': a cost is a finite number from 0 to {:g}", key, get(key), most);
    }
    CAST_CHECK(ck.step >= 0 && ck.step <= ck.config.steps, "'step' is {}, outside [0, {}] (the run's steps)", ck.step,
               ck.config.steps);
    if (f.metadata.count("log_window")) {
      ck.window = log_window_of(get("log_window"));
      // sums of the steps since the last progress line: no more examples than the run's steps
      // held, and a loss (cross-entropy) of no sign below 0
      const double most = static_cast<double>(ck.step) * static_cast<double>(ck.config.batch);
      CAST_CHECK(ck.window.examples <= most && ck.window.loss >= 0,
                 "'log_window' is '{}': its examples are more than the {} of {} steps of batch {}, or its loss is "
                 "negative",
                 get("log_window"), most, ck.step, ck.config.batch);
    }
    if (f.metadata.count("data")) ck.data = get("data");
    if (f.metadata.count("best_step")) {
      ck.best_step = whole("best_step", [](const std::string& t, size_t* u) { return std::stoll(t, u); });
      CAST_CHECK(ck.best_val >= 0 && ck.best_step >= 0 && ck.best_step <= ck.step,
                 "'best_step' is {}: the step of the best validation, from 0 to the checkpoint's step {}, and only "
                 "beside a best accuracy ('best_val' {})",
                 ck.best_step, ck.step, ck.best_val);
    }
    if (f.metadata.count("run_id")) {
      ck.run_id = get("run_id");
      CAST_CHECK(text::is_run_id(ck.run_id), "'run_id' is {}, not 16 lowercase hexadecimal digits",
                 files::json_excerpt(json(ck.run_id)));
    }
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: corrupt checkpoint metadata: {}", path, files::json_message(e)));
  }
  return ck;
}

// The first field (nested ones as 'attention.clusters') where two model configs differ.
static std::string first_difference(const json& theirs, const json& mine, const std::string& prefix) {
  // another mechanism first: the settings each reads differ with it
  if (prefix.empty() && theirs.contains("attention") && mine.contains("attention") &&
      theirs["attention"].value("mechanism", json()) != mine["attention"].value("mechanism", json()))
    return first_difference(theirs["attention"], json{{"mechanism", mine["attention"]["mechanism"]}}, "attention.");
  for (auto& [k, val] : mine.items()) {
    const bool has = theirs.contains(k);
    if (has && theirs[k].is_object() && val.is_object() && theirs[k] != val)
      return first_difference(theirs[k], val, prefix + k + ".");
    if (!has || theirs[k] != val)
      return fmt::format("'{}{}' is {} in the checkpoint but {} in this model", prefix, k,
                         has ? files::json_excerpt(theirs[k]) : "missing", files::json_excerpt(val));
  }
  return "model config";
}

// Every tensor of a checkpoint is a parameter of the model or one of its AdamW moments: another
// one would be ignored here and dropped from the next checkpoint without a word.
static void check_only_model_tensors(const TensorFile& f, const nn::ParamList& params, const std::string& path) {
  std::set<std::string> known;
  for (const auto& [name, t] : params)
    for (const char* prefix : {"param/", "adam.m/", "adam.v/"}) known.insert(prefix + name);
  for (const auto& [name, t] : f.tensors)
    CAST_CHECK(known.count(name), "checkpoint {}: tensor '{}' is neither a parameter of this model nor an AdamW moment",
               path, name);
}

std::string model_difference(const nn::ModelConfig& theirs, const nn::ModelConfig& mine) {
  const json a = used_model_json(theirs), b = used_model_json(mine);
  return a == b ? "" : first_difference(a, b, "");
}

void load_checkpoint(const std::string& path, nn::Transformer& model, std::vector<Tensor>* m, std::vector<Tensor>* v) {
  TensorFile f = read_safetensors(path, "checkpoint");
  // A NaN weight evaluates to a plausible-looking accuracy and poisons a resumed run: every
  // tensor is checked, not only those this load uses.
  const std::string damage = non_finite_in(f.tensors);
  CAST_CHECK(damage.empty(), "{}: {}: the checkpoint holds non-finite values and cannot be used", path, damage);
  // Compared as parsed values, not as text: a reformatted but equal config is the same model; a
  // setting its mechanism does not read (full attention's --clusters) makes no other model.
  CAST_CHECK(f.metadata.count("model"), "checkpoint {}: not a cast checkpoint (no 'model' metadata)", path);
  const json theirs =
      used_model_json(model_from_json(files::parse_json(f.metadata.at("model"), path + ": model config")));
  const json mine = used_model_json(model.config());
  if (theirs != mine)
    throw Error(fmt::format("{}: checkpoint does not match the model: {}", path, first_difference(theirs, mine, "")));
  nn::ParamList params = model.parameters();
  check_only_model_tensors(f, params, path);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    const Tensor& stored_t = f.get("param/" + name, DType::f32, t->shape());
    t->copy_from(stored_t.to(t->device()));
    if (m) (*m)[i].copy_from(f.get("adam.m/" + name, DType::f32, t->shape()).to(t->device()));
    if (v) {
      const Tensor& stored_v = f.get("adam.v/" + name, DType::f32, t->shape());
      // a mean of squares: a negative one would make the update's square root NaN steps later
      for (double x : stored_v.to_double_vector())
        CAST_CHECK(x >= 0, "{}: tensor 'adam.v/{}' holds {}: AdamW's second moment is never negative", path, name, x);
      (*v)[i].copy_from(stored_v.to(t->device()));
    }
  }
  const auto offset = f.metadata.find("rng_offset");
  CAST_CHECK(offset != f.metadata.end(), "{}: not a cast checkpoint (no 'rng_offset' metadata)", path);
  try {
    model.rng_offset = counter_of(offset->second);
    const auto draws = f.metadata.find("clustering_draws");
    if (draws != f.metadata.end())
      model.set_clustering_draws(clustering_draws_of(draws->second, model.blocks().size()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: corrupt checkpoint metadata: {}", path, e.what()));
  }
}

std::string other_set_note(const Checkpoint& ck, const std::string& now, const std::string& folder) {
  if (ck.data.empty() || ck.data == now) return "";
  return fmt::format("note: data folder {} holds another set than the run trained on ({}; now {})", folder, ck.data,
                     now);
}

void throw_from_recorded_data_folder(const Error& e, const std::string& folder, const std::string& path,
                                     bool task_default) {
  const std::string relative =
      std::filesystem::path(folder).is_relative()
          ? ", relative to the folder its run was started in, or last resumed in with --data"
          : "";
  const std::string why =
      task_default ? fmt::format("{} (checkpoint {} recorded no data folder: its run read the task's default, {}{}; "
                                 "give --data to read another)",
                                 e.what(), path, folder, relative)
                   : fmt::format("{} (the data folder {} is the one checkpoint {} recorded{}; give --data to read "
                                 "another)",
                                 e.what(), folder, path, relative);
  if (dynamic_cast<const UsageError*>(&e)) throw UsageError(why);
  throw Error(why);
}

void check_task_of(const Checkpoint& ck, const std::string& path) {
  const std::vector<std::string>& known = task_names();  // an edited file's: said as the file's, not the data's
  CAST_CHECK(std::find(known.begin(), known.end(), ck.config.task) != known.end(),
             "{}: corrupt checkpoint metadata: 'train' metadata: 'task' is '{}', no task of cast ({})", path,
             ck.config.task, fmt::join(known, ", "));
  // the sizes a run takes from its task (train/tasks.cpp)
  const Task& task = find_task(ck.config.task);
  const nn::ModelConfig& m = ck.config.model;
  CAST_CHECK(m.classes == task.classes && m.dual == task.dual,
             "{}: corrupt checkpoint metadata: 'model' metadata: {} classes{}, but task {} has {}{}", path, m.classes,
             m.dual ? " of two texts" : "", ck.config.task, task.classes, task.dual ? " of two texts" : "");
}

TrainedRun open_trained_run(const std::string& path, const std::string& data_dir, Device device) {
  TrainedRun run;
  run.checkpoint = read_checkpoint_header(path);
  check_task_of(run.checkpoint, path);
  if (!data_dir.empty()) run.checkpoint.config.data_dir = data_dir;
  run.model = std::make_unique<nn::Transformer>(run.checkpoint.config.model, DType::f32, device);
  load_checkpoint(path, *run.model, nullptr, nullptr);
  try {
    run.task = load_task(run.checkpoint.config, false);
  } catch (const Error& e) {
    // the folder the user gave is named as given
    const std::string folder = data_folder(run.checkpoint.config);
    if (!data_dir.empty() || folder.empty()) throw;
    throw_from_recorded_data_folder(e, folder, path, run.checkpoint.config.data_dir.empty());
  }
  run.data_note = other_set_note(run.checkpoint, data::fingerprint(run.task), data_folder(run.checkpoint.config));
  const nn::ModelConfig& m = run.checkpoint.config.model;  // images of another size: said as train says it
  CAST_CHECK_USAGE(run.task.image_side == 0 || run.task.image_side * run.task.image_side == m.max_len,
                   "{}: the images in {} are {} x {} ({} pixels), not the {} the model reads", path,
                   data_folder(run.checkpoint.config), run.task.image_side, run.task.image_side,
                   run.task.image_side * run.task.image_side, m.max_len);
  return run;
}

void check_outside_data(const std::string& out, const std::string& option, const TrainConfig& trained,
                        const std::string& data_dir) {
  TrainConfig config = trained;
  if (!data_dir.empty()) config.data_dir = data_dir;
  files::check_not_inside(out, "--" + option, data_folder(config), "data folder");
}

void check_swappable(nn::Mechanism from, nn::Mechanism to) {
  CAST_CHECK_USAGE(from != nn::Mechanism::cast,
                   "--attention {}: this is a CAST model, whose attention cannot be swapped (its surrogate tokens "
                   "and gate have no place in other mechanisms; evaluate it without --attention)",
                   nn::mechanism_name(to));
  CAST_CHECK_USAGE(to != nn::Mechanism::cast,
                   "--attention cast: CAST needs surrogate tokens and a gate that a trained {} model does not have "
                   "(full, clustered and iclustered share their weights)",
                   nn::mechanism_name(from));
}

std::unique_ptr<nn::Transformer> with_attention(nn::Transformer& trained_model, const nn::AttentionConfig& attention,
                                                Device device) {
  nn::ModelConfig config = trained_model.config();
  check_swappable(config.attention.mechanism, attention.mechanism);
  const nn::AttentionConfig& trained = config.attention;
  nn::AttentionConfig swapped_attention = attention;  // the sizes, the seed of the LSH planes and the path kept
  swapped_attention.dim = trained.dim, swapped_attention.heads = trained.heads;
  swapped_attention.seed = trained.seed, swapped_attention.fused = trained.fused;
  config.attention = swapped_attention;
  auto swapped = std::make_unique<nn::Transformer>(config, DType::f32, device);
  nn::ParamList theirs = trained_model.parameters(), mine = swapped->parameters();
  CAST_CHECK(theirs.size() == mine.size(), "swap_attention: {} parameters against {}", theirs.size(), mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    CAST_CHECK(theirs[i].first == mine[i].first && theirs[i].second->shape() == mine[i].second->shape(),
               "swap_attention: parameter {} does not match {}", theirs[i].first, mine[i].first);
    mine[i].second->copy_from(*theirs[i].second);
  }
  swapped->rng_offset = trained_model.rng_offset;
  swapped->set_clustering_draws(trained_model.clustering_draws());
  return swapped;
}

void swap_attention(TrainedRun& run, const nn::AttentionConfig& attention, Device device) {
  run.model = with_attention(*run.model, attention, device);
  run.checkpoint.config.model = run.model->config();
}

// ---------------------------------------------------------------- resuming
TrainConfig resume_config(const std::string& checkpoint, const json& changes) {
  CAST_CHECK_USAGE(changes.is_object(), "resume settings: expected a JSON object");
  const Checkpoint ck = read_checkpoint_header(checkpoint);
  TrainConfig c = ck.config;
  // The folder stored inside is where the run was trained: this file may be a copy of it,
  // and that run is not to be touched.
  c.run_dir = std::filesystem::path(checkpoint).parent_path().string();
  if (c.run_dir.empty()) c.run_dir.assign(1, '.');  // gcc 12 -Wrestrict misreads a literal here
  std::string changeable;
  for (const Setting& s : settings())
    if (s.resumable) changeable += (changeable.empty() ? "" : ", ") + s.name;
  for (auto& [key, value] : changes.items()) {
    if (key == "task") {
      CAST_CHECK_USAGE(value.is_string() && value.get<std::string>() == c.task,
                       "setting 'task' cannot change when resuming: {} is a {} run", checkpoint, c.task);
      continue;
    }
    TrainConfig changed = c;
    apply_overrides(changed, json{{key, value}}, Check::each);  // an unknown setting is refused here
    if (key == "seed" && changed.seed == c.seed) continue;  // the run's own seed (a preset run's model used 0)
    // a setting the mechanism does not read (full attention's --clusters) changes no run
    if (find_setting(key)->resumable || used_settings_json(changed) == used_settings_json(c)) {
      c = changed;
    } else {
      throw UsageError(
          fmt::format("setting '{}' cannot change when resuming: {} was trained with {}, not {}; only {} "
                      "may change (start a new run for other settings)",
                      key, checkpoint, setting_value(c, key), setting_value(changed, key), changeable));
    }
  }
  validate(c);  // the settings against each other, once every change is in
  CAST_CHECK_USAGE(!changes.contains("steps") || c.steps > ck.step,
                   "setting 'steps' is {}: a resumed run must end after its checkpoint's step {} ({})", c.steps,
                   ck.step, checkpoint);
  return c;
}

}  // namespace cast::train
