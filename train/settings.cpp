// The table of training settings, and everything read from it: presets, the config reader,
// validation, the flags and their help, and the settings as a checkpoint stores them.
#include "train/settings.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>

#include "tensor/files.h"
#include "tensor/text.h"
#include "train/tasks.h"

namespace cast::train {

using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------- building a row
// A field of TrainConfig, for the const getter and the setter alike: AT(model.dim).
#define AT(member) \
  [](auto& c) -> auto& { return c.member; }

Setting row(const char* name, Kind kind, Home home, const char* help) {
  Setting s;
  s.name = name, s.kind = kind, s.home = home, s.help = help;
  return s;
}

template <class Field>
Setting integer(const char* name, Home home, int64_t lo, int64_t hi, const char* help, Field field) {
  Setting s = row(name, Kind::integer, home, help);
  s.lo = lo, s.hi = hi;
  s.get = [field](const TrainConfig& c) { return json(field(c)); };
  s.set = [field](TrainConfig& c, const json& v) { field(c) = v.get<int64_t>(); };
  return s;
}

template <class Field>
Setting number(const char* name, Home home, Bound bound, const char* help, Field field) {
  Setting s = row(name, Kind::number, home, help);
  s.bound = bound;
  s.get = [field](const TrainConfig& c) { return json(field(c)); };
  s.set = [field](TrainConfig& c, const json& v) { field(c) = v.get<double>(); };
  return s;
}

template <class Field>
Setting word(const char* name, const char* help, const char* when_empty, Field field) {
  Setting s = row(name, Kind::word, Home::run, help);
  s.when_empty = when_empty;
  s.get = [field](const TrainConfig& c) { return json(field(c)); };
  s.set = [field](TrainConfig& c, const json& v) { field(c) = v.get<std::string>(); };
  return s;
}

// A choice whose getter and setter the caller writes.
Setting choice(const char* name, Home home, const char* help, std::vector<std::string> words) {
  Setting s = row(name, Kind::choice, home, help);
  s.words = std::move(words);
  return s;
}

// A choice kept in the config as the word itself.
template <class Field>
Setting choice(const char* name, const char* help, std::vector<std::string> words, Field field) {
  Setting s = choice(name, Home::run, help, std::move(words));
  s.get = [field](const TrainConfig& c) { return json(field(c)); };
  s.set = [field](TrainConfig& c, const json& v) { field(c) = v.get<std::string>(); };
  return s;
}

// A choice of two words kept in the config as a bool: true is `words[yes]`.
template <class Field>
Setting two_words(const char* name, Home home, const char* help, std::vector<std::string> words, int yes, Field field) {
  Setting s = choice(name, home, help, words);
  s.get = [field, words, yes](const TrainConfig& c) { return json(words[field(c) ? yes : 1 - yes]); };
  s.set = [field, words, yes](TrainConfig& c, const json& v) { field(c) = v.get<std::string>() == words[yes]; };
  return s;
}

template <class Field>
Setting flag(const char* name, const char* help, Field field) {
  Setting s = row(name, Kind::flag, Home::run, help);
  s.default_text = "false";
  s.get = [field](const TrainConfig& c) { return json(field(c)); };
  s.set = [field](TrainConfig& c, const json& v) { field(c) = v.get<bool>(); };
  return s;
}

// The setting's default, then the presets that differ from it.
Setting defaults(Setting s, const char* value, std::vector<std::pair<std::string, std::string>> per_task = {}) {
  s.default_text = value;
  s.per_task = std::move(per_task);
  return s;
}

// Of the settings a run may change on the way (when it stops, what it logs and evaluates,
// where it reads data and writes files, what runs it): every other setting shapes the model or
// its optimisation, which the checkpoint fixes.
Setting resumable(Setting s) {
  s.resumable = true;
  return s;
}

Setting old_spelling(Setting s, const char* key, const char* if_false = nullptr, const char* if_true = nullptr) {
  s.old = {key, if_false, if_true};
  return s;
}

// A model setting that checkpoints written before it lack: they were trained with `value`.
Setting absent_before(Setting s, const char* value) {
  s.absent = value;
  return s;
}

constexpr int64_t kBig = int64_t{1} << 40;

// ---------------------------------------------------------------- the table
Setting seed_setting() {
  Setting seed = integer("seed", Home::run, 0, INT64_MAX,
                         "seed of data order, initialisation and dropout; left unset, the data order's is 1 and the "
                         "initialisation's 0 (as before the setting), so --seed 1 is not the unset run",
                         AT(seed));
  seed.set = [](TrainConfig& c, const json& v) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) throw UsageError(fmt::format("setting 'seed' is {}: it must be at least 0", s));
    c.seed = c.model.seed = static_cast<uint64_t>(s);  // the data order, and the model's initialisation
  };
  return seed;
}

Setting mechanism_setting() {
  Setting mechanism = choice("attention", Home::attention, "", {"full", "cast", "clustered", "iclustered"});
  mechanism.get = [](const TrainConfig& c) { return json(nn::mechanism_name(c.model.attention.mechanism)); };
  mechanism.set = [](TrainConfig& c, const json& v) {
    c.model.attention.mechanism = nn::parse_mechanism(v.get<std::string>());
  };
  return mechanism;
}

Setting f_setting() {
  Setting f = choice("f", Home::attention, "CAST:", {"softmax", "laplace"});
  f.get = [](const TrainConfig& c) {
    return json(c.model.attention.f == ops::AttentionFn::laplace ? "laplace" : "softmax");
  };
  f.set = [](TrainConfig& c, const json& v) {
    c.model.attention.f = v == "laplace" ? ops::AttentionFn::laplace : ops::AttentionFn::softmax;
  };
  return f;
}

// What a resumed run may change: when it stops, what it logs, evaluates and saves, where
// it reads and writes, what runs it.
std::vector<Setting> run_settings() {
  const auto run = Home::run;
  return {
      resumable(defaults(integer("steps", run, 0, kBig, "training steps", AT(steps)), "5000",
                         {{"listops-short", "1200"},
                          {"text", "20000"},
                          {"image", "35000"},
                          {"pathfinder", "62400"},
                          {"pathx", "500000"},
                          {"fashion-mnist", "3000"},
                          {"fashion-mnist-14", "2000"},
                          {"fashion-mnist-lra", "42800"}})),
      resumable(defaults(integer("log-every", run, 1, kBig, "steps between progress lines", AT(log_every)), "20")),
      resumable(
          defaults(integer("eval-every", run, 0, kBig, "steps between validations (0: at the end)", AT(eval_every)),
                   "0", {{"fashion-mnist-14", "500"}, {"fashion-mnist-lra", "1070"}})),
      resumable(defaults(integer("checkpoint-every", run, 0, kBig, "steps between checkpoints (0: at the end only)",
                                 AT(checkpoint_every)),
                         "200")),
      resumable(
          defaults(integer("eval-limit", run, 0, kBig, "examples per evaluated split (0: all)", AT(eval_limit)), "0")),
      resumable(flag("eval-best",
                     "evaluate the best validation checkpoint instead of the final model (needs "
                     "--eval-every)",
                     AT(eval_best))),
      resumable(defaults(word("data", "data folder", "the task's folder under data/", AT(data_dir)), "")),
      resumable(defaults(word("run", "run folder", "runs/<task>-<attention>", AT(run_dir)), "")),
      resumable(defaults(choice("device", "", {"auto", "cpu", "cuda"}, AT(device)), "auto")),
      resumable(defaults(choice("precision",
                                "products on the GPU: fp32 (FP32 accuracy), tf32 (TF32 tensor cores), bf16 "
                                "(BF16 operands, FP32 accumulation, as torch.autocast); the CPU runs fp32 only",
                                {"fp32", "tf32", "bf16"}, AT(precision)),
                         "fp32")),
      resumable(flag("recompute",
                     "keep only each block's input from the forward and run the block again in the backward: "
                     "less memory for one more forward per step, the same results",
                     AT(recompute))),
      resumable(flag("reference",
                     "run the step-by-step reference attention ops instead of the fast paths (CPU "
                     "and GPU), and on the CPU the plain-loop matmul instead of the BLAS (same results, "
                     "slower; for study)",
                     AT(reference))),
  };
}

// The optimisation.
std::vector<Setting> optimisation_settings() {
  const auto run = Home::run;
  return {
      defaults(integer("batch", run, 1, 1 << 20, "batch size", AT(batch)), "32",
               {{"image", "256"},
                {"pathfinder", "512"},
                {"pathx", "64"},
                {"fashion-mnist", "64"},
                {"fashion-mnist-14", "64"},
                {"fashion-mnist-lra", "256"}}),
      defaults(number("lr", run, Bound::positive, "peak learning rate (rsqrt: the LRA base rate)", AT(lr)), "1e-3",
               {{"listops-short", "2e-3"},
                {"listops", "0.05"},
                {"text", "0.05"},
                {"retrieval", "0.05"},
                {"image", "5e-4"},
                {"fashion-mnist-14", "2e-3"},
                {"fashion-mnist-lra", "5e-4"}}),
      defaults(choice("schedule", "", {"rsqrt", "cosine", "constant"}, AT(schedule)), "cosine",
               {{"listops", "rsqrt"}, {"text", "rsqrt"}, {"retrieval", "rsqrt"}}),
      defaults(integer("warmup", run, 0, kBig, "warmup steps", AT(warmup)), "1000",
               {{"listops-short", "100"},
                {"text", "8000"},
                {"retrieval", "8000"},
                {"image", "175"},
                {"pathfinder", "312"},
                {"pathx", "2500"},
                {"fashion-mnist", "200"},
                {"fashion-mnist-14", "100"},
                {"fashion-mnist-lra", "214"}}),
      defaults(
          number("weight-decay", run, Bound::non_negative, "AdamW weight decay", AT(weight_decay)), "0.1",
          {{"listops-short", "0.01"}, {"image", "0"}, {"pathfinder", "0"}, {"pathx", "0"}, {"fashion-mnist-lra", "0"}}),
      defaults(number("clip", run, Bound::non_negative, "gradient norm clip (0: off)", AT(clip)), "1",
               {{"listops", "0"},
                {"text", "0"},
                {"retrieval", "0"},
                {"image", "0"},
                {"pathfinder", "0"},
                {"fashion-mnist-lra", "0"}}),
      defaults(seed_setting(), "1"),
  };
}

// The model.
std::vector<Setting> model_settings() {
  const auto model = Home::model;
  return {
      old_spelling(defaults(integer("max-len", model, 1, 1 << 22, "longest sequence (of pixels under --patch)",
                                    AT(model.max_len)),
                            "1024",
                            {{"listops-short", "48"},
                             {"listops", "2000"},
                             {"text", "4096"},
                             {"retrieval", "4000"},
                             {"pathx", "16384"},
                             {"fashion-mnist", "784"},
                             {"fashion-mnist-14", "196"},
                             {"fashion-mnist-lra", "784"}}),
                   "max_len"),
      absent_before(defaults(integer("patch", model, 1, 64,
                                     "images: a token per patch x patch pixels, embedded linearly (1: a token "
                                     "per pixel, its grey level as a token id)",
                                     AT(model.patch)),
                             "1"),
                    "1"),
      defaults(integer("dim", model, 1, 1 << 16, "model dim D", AT(model.dim)), "64",
               {{"listops", "512"},
                {"text", "256"},
                {"retrieval", "128"},
                {"image", "128"},
                {"fashion-mnist-lra", "128"},
                {"pathfinder", "32"},
                {"pathx", "32"}}),
      defaults(integer("heads", model, 1, 1024, "attention heads", AT(model.heads)), "4",
               {{"listops", "8"}, {"image", "8"}, {"fashion-mnist-lra", "8"}, {"pathx", "2"}}),
      old_spelling(
          defaults(
              integer("mlp-dim", model, 1, 1 << 18, "MLP hidden width", AT(model.mlp_dim)), "128",
              {{"listops", "1024"}, {"text", "1024"}, {"retrieval", "512"}, {"pathfinder", "32"}, {"pathx", "32"}}),
          "mlp_dim"),
      defaults(integer("layers", model, 1, 1024, "blocks", AT(model.layers)), "4",
               {{"listops-short", "2"},
                {"image", "1"},
                {"pathx", "1"},
                {"fashion-mnist", "1"},
                {"fashion-mnist-14", "1"},
                {"fashion-mnist-lra", "1"}}),
      defaults(number("dropout", model, Bound::fraction, "dropout rate", AT(model.dropout)), "0.1",
               {{"listops-short", "0"},
                {"image", "0.3"},
                {"pathfinder", "0.2"},
                {"fashion-mnist-14", "0"},
                {"fashion-mnist-lra", "0.3"}}),
      old_spelling(
          defaults(two_words("positions", model, "", {"sinusoidal", "learned"}, 1, AT(model.learned_positions)),
                   "sinusoidal",
                   {{"image", "learned"},
                    {"pathx", "learned"},
                    {"fashion-mnist", "learned"},
                    {"fashion-mnist-14", "learned"},
                    {"fashion-mnist-lra", "learned"}}),
          "learned_positions", "sinusoidal", "learned"),
      old_spelling(
          defaults(
              two_words("pooling", model, "", {"cls", "mean"}, 0, AT(model.cls_pooling)), "cls",
              {{"pathfinder", "mean"}, {"pathx", "mean"}, {"fashion-mnist", "mean"}, {"fashion-mnist-14", "mean"}}),
          "cls_pooling", "mean", "cls"),
  };
}

// The attention.
std::vector<Setting> attention_settings() {
  const auto attention = Home::attention;
  return {
      defaults(mechanism_setting(), "cast"),
      defaults(integer("clusters", attention, 0, nn::AttentionLimits::clusters,
                       "clusters C (0: ceil(sqrt(N)) rounded up to 8)", AT(model.attention.clusters)),
               "0"),
      old_spelling(defaults(integer("cluster-size", attention, 0, nn::AttentionLimits::cluster_size,
                                    "CAST cluster size (0: same default)", AT(model.attention.cluster_size)),
                            "0"),
                   "cluster_size"),
      old_spelling(defaults(two_words("clustering", attention, "CAST:", {"topk", "satopk"}, 1,
                                      AT(model.attention.single_assignment)),
                            "topk"),
                   "single_assignment", "topk", "satopk"),
      defaults(f_setting(), "softmax"),
      old_spelling(
          defaults(two_words("summaries", attention, "CAST:", {"on", "off"}, 0, AT(model.attention.summaries)), "on"),
          "summaries", "off", "on"),
      old_spelling(
          defaults(two_words("mix", attention, "CAST:", {"affinity", "query"}, 1, AT(model.attention.mix_query)),
                   "affinity"),
          "mix_query", "affinity", "query"),
      old_spelling(defaults(two_words("cast-heads", attention, "CAST:", {"per-head", "shared"}, 1,
                                      AT(model.attention.shared_clustering)),
                            "per-head"),
                   "shared_clustering", "per-head", "shared"),
      absent_before(defaults(two_words("surrogates", attention,
                                       "CAST: the surrogate tokens trained, or frozen at "
                                       "their random start (static directions)",
                                       {"learned", "frozen"}, 1, AT(model.attention.frozen_surrogates)),
                             "learned"),
                    "learned"),
      defaults(integer("topk", attention, 1, nn::AttentionLimits::topk, "improved clustered: keys per cluster",
                       AT(model.attention.topk)),
               "32"),
      defaults(
          integer("bits", attention, 1, nn::AttentionLimits::bits, "clustered: hash bits", AT(model.attention.bits)),
          "63"),
      defaults(integer("iterations", attention, 0, nn::AttentionLimits::iterations, "clustered: Lloyd iterations",
                       AT(model.attention.iterations)),
               "10"),
  };
}

std::vector<Setting> make_table() {
  std::vector<Setting> table;
  for (std::vector<Setting> (*part)() : {run_settings, optimisation_settings, model_settings, attention_settings})
    for (Setting& s : part()) table.push_back(std::move(s));
  return table;
}
#undef AT

std::string joined(const std::vector<std::string>& words, const char* separator) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : separator) + w;
  return out;
}

// An integer setting: a JSON integer that fits int64. A float such as 6.7e24 is refused here
// (converting it to an integer is undefined behaviour; the fuzzer found it). A whole number
// beyond 64 bits is read by the JSON parser as a float: it is said to be out of range, which it
// is, not to be no integer.
json integer_value(const std::string& name, const json& v) {
  if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
      std::abs(v.get<double>()) >= 0x1p63)
    throw UsageError(fmt::format("setting '{}' is {}: out of range (a whole number of at most {})", name,
                                 files::json_excerpt(v), INT64_MAX));
  if (!v.is_number_integer())
    throw UsageError(fmt::format("setting '{}' is {}: it must be an integer", name, files::json_excerpt(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})
    throw UsageError(
        fmt::format("setting '{}' is {}: out of range (at most {})", name, files::json_excerpt(v), INT64_MAX));
  return v;
}

// One of the words a choice setting accepts, or a usage error naming the setting.
json choice_value(const Setting& s, const json& value) {
  const std::string v = value.get<std::string>();
  for (const std::string& w : s.words)
    if (v == w) return value;
  throw UsageError(fmt::format("setting '{}' is '{}': it must be one of {}", s.name, v, joined(s.words, " | ")));
}

// Sets one setting from JSON, the value checked for the setting's kind first.
void set_from_json(TrainConfig& c, const Setting& s, const json& value) {
  switch (s.kind) {
    case Kind::integer: return s.set(c, integer_value(s.name, value));
    case Kind::number: return s.set(c, json(value.get<double>()));
    case Kind::word: return s.set(c, json(value.get<std::string>()));
    case Kind::choice: return s.set(c, choice_value(s, value));
    case Kind::flag: return s.set(c, json(value.get<bool>()));
  }
}

// "1200" when every task's preset agrees, else the commonest value and the exceptions:
// "32 (image 256, pathfinder 512)". Read from the presets themselves.
std::string preset_defaults(const std::string& name) {
  std::vector<std::pair<std::string, std::string>> values;
  std::map<std::string, int> count;
  for (const std::string& task : task_names()) {
    values.push_back({task, setting_value(preset(task), name)});
    ++count[values.back().second];
  }
  std::string common;
  for (auto& [v, n] : count)
    if (common.empty() || n > count[common]) common = v;
  std::string rest;
  for (auto& [task, v] : values)
    if (v != common) rest += fmt::format("{}{} {}", rest.empty() ? "" : ", ", task, v);
  return rest.empty() ? common : fmt::format("{} ({})", common, rest);
}

std::string help_line(const Setting& s) {
  if (s.kind != Kind::choice) return s.help;
  return (s.help.empty() ? "" : s.help + " ") + joined(s.words, " | ");
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = make_table();
  return table;
}

const Setting* find_setting(const std::string& name) {
  for (const Setting& s : settings())
    if (s.name == name) return &s;
  return nullptr;
}

// ---------------------------------------------------------------- presets
TrainConfig preset(const std::string& task) {
  const Task& t = find_task(task);
  TrainConfig c;
  c.task = task;
  c.model.vocab = t.vocab, c.model.classes = t.classes, c.model.dual = t.dual;
  for (const Setting& s : settings()) {
    std::string text = s.default_text;
    for (const auto& [name, value] : s.per_task)
      if (name == task) text = value;
    set_from_json(c, s, setting_from_text(s.name, text));
  }
  // A preset run initialises its model from seed 0 (the data order is --seed's, 1): so every
  // run made before --seed set both trains again bit for bit. --seed sets both.
  c.model.seed = 0;
  return c;
}

// ---------------------------------------------------------------- reading and checking
void apply_overrides(TrainConfig& c, const json& j, Check check) {
  CAST_CHECK(j.is_object(), "config: expected a JSON object");
  for (auto& [key, value] : j.items()) {
    if (key == "task") continue;  // chosen before the preset
    const Setting* s = find_setting(key);
    if (!s) throw UsageError(fmt::format("unknown setting '{}'", key));
    try {
      set_from_json(c, *s, value);
    } catch (const json::exception&) {
      const char* expected = s->kind == Kind::integer  ? "a whole number"
                             : s->kind == Kind::number ? "a number"
                             : s->kind == Kind::flag   ? "true or false"
                                                       : "a string";
      throw UsageError(fmt::format("setting '{}' has the wrong type: {}, where {} is expected", key,
                                   files::json_excerpt(value), expected));
    }
  }
  if (check == Check::all) validate(c);
  else validate_each(c);
}

// Every setting within its range, checked where settings enter (flags, a JSON file, a
// checkpoint): one line naming the setting, its value and what it accepts.
void validate_each(const TrainConfig& c) {
  auto in_range = [](const std::string& name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) throw UsageError(fmt::format("setting '{}' is {}: it must be in [{}, {}]", name, v, lo, hi));
  };
  // the task's sizes, stored in a checkpoint, are input too: checked before any allocation
  in_range("vocab", c.model.vocab, 1, 1 << 24);
  in_range("classes", c.model.classes, 2, 1 << 20);  // a classifier of one class learns nothing
  for (const Setting& s : settings()) {
    if (s.kind == Kind::integer && s.name != "seed") in_range(s.name, s.get(c).get<int64_t>(), s.lo, s.hi);
    if (s.kind != Kind::number) continue;
    const double v = s.get(c).get<double>();
    if (std::fpclassify(v) == FP_SUBNORMAL)  // as the flag's reader refuses 1e-320: out of range
      throw UsageError(fmt::format("setting '{}' is {}: out of range (below the smallest normal double)", s.name, v));
    if (s.bound == Bound::fraction) {
      if (!(v >= 0 && v < 1)) throw UsageError(fmt::format("setting '{}' is {}: it must be in [0, 1)", s.name, v));
      continue;
    }
    const bool zero_ok = s.bound == Bound::non_negative;
    if (!std::isfinite(v) || v < 0 || (!zero_ok && v == 0))
      throw UsageError(
          fmt::format("setting '{}' is {}: it must be a {} number", s.name, v, zero_ok ? "non-negative" : "positive"));
  }
}

void validate(const TrainConfig& c) {
  validate_each(c);
  const nn::ModelConfig& m = c.model;
  if (m.patch > 1) {
    const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(m.max_len))));
    if (side * side != m.max_len)
      throw UsageError(fmt::format("setting 'patch' is {}: patches are for image tasks, whose 'max-len' is the "
                                   "pixels of a square image, and {} is no square",
                                   m.patch, m.max_len));
    if (side % m.patch != 0)
      throw UsageError(fmt::format("setting 'patch' is {}: it must divide the image's side, {} pixels ('max-len' {} "
                                   "is {} x {})",
                                   m.patch, side, m.max_len, side, side));
  }
  if (m.dim % m.heads != 0)
    throw UsageError(fmt::format("setting 'dim' is {}: it must be a multiple of 'heads' ({})", m.dim, m.heads));
  // AdamW multiplies the weights by 1 − lr·wd each step: at 1 or more that zeroes them or flips
  // their sign every step
  if (c.lr * c.weight_decay >= 1)
    throw UsageError(fmt::format("setting 'weight-decay' is {}: with 'lr' {} the weights would be multiplied by "
                                 "1 - lr * weight-decay = {} each step; it must be below 1 / lr",
                                 c.weight_decay, c.lr, 1 - c.lr * c.weight_decay));
}

std::string setting_value(const TrainConfig& c, const std::string& name) {
  const Setting* s = find_setting(name);
  if (!s) throw Error(fmt::format("no setting '{}'", name));
  const json v = s->get(c);
  switch (s->kind) {
    case Kind::integer: return v.dump();
    case Kind::number: return fmt::format("{}", v.get<double>());  // shortest round trip: unequal values print unequal
    case Kind::flag: return v.get<bool>() ? "true" : "false";
    default: {
      const std::string text = v.get<std::string>();
      return text.empty() && !s->when_empty.empty() ? s->when_empty : text;
    }
  }
}

json setting_from_text(const std::string& name, const std::string& text) {
  const Setting* s = find_setting(name);
  if (!s) throw UsageError(fmt::format("'{}' is not a setting of cast train (see cast train --help)", name));
  text::Decimal read = text::Decimal::not_a_number;
  if (s->kind == Kind::integer) {
    int64_t v = 0;
    if ((read = text::read_decimal(text, v)) == text::Decimal::ok) return json(v);
  } else if (s->kind == Kind::number) {
    double v = 0;
    if ((read = text::read_decimal(text, v)) == text::Decimal::ok) return json(v);
  } else if (s->kind == Kind::flag) {
    if (text == "true" || text == "false") return json(text == "true");
  } else {
    return json(text);
  }
  if (read == text::Decimal::out_of_range)
    throw UsageError(fmt::format("setting '{}': '{}' is beyond the range of {} (too large, or too close to 0)", name,
                                 text, s->kind == Kind::integer ? "a 64-bit integer" : "a double"));
  throw UsageError(fmt::format("setting '{}': '{}' is not {}", name, text,
                               s->kind == Kind::integer  ? "a whole number"
                               : s->kind == Kind::number ? "a number"
                                                         : "'true' or 'false'"));
}

// ---------------------------------------------------------------- as stored
json run_settings_json(const TrainConfig& c) {
  json j = {{"task", c.task}};
  for (const Setting& s : settings())
    if (s.home == Home::run) j[s.name] = s.get(c);
  return j;
}

namespace {

// Where a model setting sits in the "model" metadata: the attention settings in their group,
// the mechanism as the group's "mechanism".
std::string model_key(const Setting& s) { return s.name == "attention" ? "mechanism" : s.name; }

// A stored integer: a JSON integer that fits int64 (a float like 1e30 would convert with
// undefined behaviour).
int64_t stored_integer(const json& j, const std::string& key) {
  if (!j.contains(key)) throw Error(fmt::format("model config: '{}' is missing", key));
  const json& v = j.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
    throw Error(fmt::format("model config: '{}' is {}, not an integer", key, files::json_excerpt(v)));
  return v.get<int64_t>();
}

// A model setting's stored value, under its name or its spelling before the table.
json stored_value(const json& group, const Setting& s) {
  const std::string key = model_key(s);
  if (group.contains(key) && !group.at(key).is_boolean()) return group.at(key);
  const char* old_key = s.old.key ? s.old.key : key.c_str();
  if (!group.contains(old_key) && !group.contains(key) && s.absent) return setting_from_text(s.name, s.absent);
  if (!group.contains(old_key)) throw Error(fmt::format("model config: '{}' is missing", key));
  const json& v = group.at(old_key);
  if (s.old.if_false && v.is_boolean()) return json(v.get<bool>() ? s.old.if_true : s.old.if_false);
  return s.kind == Kind::integer ? json(stored_integer(group, old_key)) : v;
}

}  // namespace

json model_json(const nn::ModelConfig& m) {
  TrainConfig c;
  c.model = m;
  json j = {{"vocab", m.vocab}, {"classes", m.classes}, {"dual", m.dual}, {"seed", m.seed}};
  json group = json::object();
  for (const Setting& s : settings()) {
    if (s.home == Home::model) j[model_key(s)] = s.get(c);
    if (s.home == Home::attention) group[model_key(s)] = s.get(c);
  }
  j["attention"] = group;
  return j;
}

nn::ModelConfig model_from_json(const json& j) {
  CAST_CHECK(j.is_object() && j.contains("attention") && j.at("attention").is_object(),
             "model config: not an object with an 'attention' object");
  TrainConfig c;
  nn::ModelConfig& m = c.model;
  // the field being read and its object: a library error of a wrong type names it
  std::string field = "dual";
  const json* holder = &j;
  try {
    m.vocab = stored_integer(j, "vocab");
    m.classes = stored_integer(j, "classes");
    CAST_CHECK(j.contains("dual"), "model config: 'dual' is missing");
    m.dual = j.at("dual").get<bool>();
    const int64_t seed = stored_integer(j, "seed");
    if (seed < 0) throw Error(fmt::format("model config: 'seed' is {}", seed));
    m.seed = static_cast<uint64_t>(seed);
    // every key is one this reads (or read under an older spelling): an edited or foreign field
    // is refused, not ignored
    std::set<std::string> top = {"vocab", "classes", "dual", "seed", "attention"}, group_keys;
    for (const Setting& s : settings()) {
      if (s.home == Home::run) continue;
      const json& group = s.home == Home::attention ? j.at("attention") : j;
      field = model_key(s), holder = &group;
      if (!group.contains(field) && s.old.key && group.contains(s.old.key)) field = s.old.key;  // an older spelling
      (s.home == Home::attention ? group_keys : top).insert({model_key(s), s.old.key ? s.old.key : model_key(s)});
      const json v = stored_value(group, s);
      if (s.kind == Kind::integer) s.set(c, json(stored_integer(json{{s.name, v}}, s.name)));
      else set_from_json(c, s, v);
    }
    for (const auto& [key, value] : j.items())
      CAST_CHECK(top.count(key), "model config: '{}' is no setting of a model", key);
    for (const auto& [key, value] : j.at("attention").items())
      CAST_CHECK(group_keys.count(key), "model config: 'attention' holds '{}', no setting of attention", key);
  } catch (const json::exception& e) {
    // "type must be string, but is number": the kind the field must have
    const std::string message = files::json_message(e), must = "type must be ";
    const size_t at = message.find(must), comma = message.find(',', at);
    const std::string wanted = at == std::string::npos ? message : message.substr(at + must.size(), comma - at - must.size());
    if (!holder->contains(field)) throw Error(fmt::format("model config: '{}' is missing", field));
    throw Error(fmt::format("model config: '{}' is {}, where a {} is expected", field,
                            files::json_excerpt(holder->at(field)), wanted));
  }
  return m;
}

json all_settings_json(const TrainConfig& c) {
  json j = run_settings_json(c);
  j["model"] = model_json(c.model);
  return j;
}

bool mechanism_reads(nn::Mechanism mechanism, const std::string& name) {
  using M = nn::Mechanism;
  if (name == "clusters") return mechanism != M::full;
  if (name == "topk") return mechanism == M::iclustered;
  if (name == "bits" || name == "iterations") return mechanism == M::clustered || mechanism == M::iclustered;
  for (const char* cast_only : {"cluster-size", "clustering", "f", "summaries", "mix", "cast-heads", "surrogates"})
    if (name == cast_only) return mechanism == M::cast;
  return true;  // the mechanism itself
}

std::string fixed_setting_difference(const TrainConfig& theirs, const TrainConfig& mine) {
  for (const Setting& s : settings()) {
    if (s.resumable) continue;
    if (s.home == Home::attention && !mechanism_reads(mine.model.attention.mechanism, s.name) &&
        !mechanism_reads(theirs.model.attention.mechanism, s.name))
      continue;
    if (s.get(theirs) != s.get(mine))
      return fmt::format("setting '{}' is {} there but {} in this run", s.name, setting_value(theirs, s.name),
                         setting_value(mine, s.name));
  }
  return "";
}

json used_model_json(const nn::ModelConfig& m) {
  json j = model_json(m);
  for (const Setting& s : settings())
    if (s.home == Home::attention && !mechanism_reads(m.attention.mechanism, s.name))
      j["attention"].erase(model_key(s));
  return j;
}

json used_settings_json(const TrainConfig& c) {
  json j = all_settings_json(c);
  j["model"] = used_model_json(c.model);
  return j;
}

// ---------------------------------------------------------------- flags and files
void declare_setting_flags(cli::Args& args, const std::vector<std::string>& except) {
  for (const Setting& s : settings()) {
    if (std::find(except.begin(), except.end(), s.name) != except.end()) continue;
    if (s.kind == Kind::flag) args.flag(s.name, s.help);
    else args.option(s.name, "", help_line(s) + "; default " + preset_defaults(s.name));  // each task's
  }
}

json settings_from_flags(const cli::Args& args) {
  json j = json::object();
  for (const Setting& s : settings()) {
    if (!args.is_set(s.name)) continue;
    if (s.kind == Kind::integer) j[s.name] = args.integer(s.name);
    else if (s.kind == Kind::number) j[s.name] = args.number(s.name);
    else if (s.kind == Kind::flag) j[s.name] = true;
    else j[s.name] = args.str(s.name);
  }
  return j;
}

json read_settings_file(const std::string& path) {
  json j;
  try {  // what a settings file says is a command line's settings: its mistakes are usage errors
    j = files::parse_json(files::read_file(path, "config file", uint64_t{1} << 28), "config file " + path);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    if (!files::exists(path)) throw;  // a file that is not there (or cannot be read) is no setting's
    throw UsageError(e.what());
  }
  CAST_CHECK_USAGE(j.is_object(), "config file {}: holds {}, not one JSON object of settings", path, j.type_name());
  for (const char* folder : {"run", "data"})  // "" would mean the default folder, and data generated there
    CAST_CHECK_USAGE(!(j.contains(folder) && j[folder] == json("")),
                     "config file {}: setting '{}' is empty (leave it out for the default folder)", path, folder);
  const std::string control = control_character_in(j);
  CAST_CHECK_USAGE(control.empty(), "config file {}: {}", path, control);
  return j;
}

// "\u0000" would end a name or path where the system reads it, a newline or an escape break the
// messages that repeat it: refused wherever settings are read, as in a flag's value
std::string control_character_in(const json& settings) {
  for (const auto& [key, value] : settings.items()) {
    if (!value.is_string()) continue;
    const std::string v = value.get<std::string>();
    for (size_t i = 0; i < v.size(); ++i) {
      const auto c = static_cast<unsigned char>(v[i]);
      if (text::is_control(c)) return fmt::format("setting '{}' holds the control character \\u{:04X}", key, c);
      if (text::is_c1_control(v, i))
        return fmt::format("setting '{}' holds the control character \\u{:04X}", key,
                           static_cast<unsigned char>(v[i + 1]));
    }
  }
  return "";
}

std::string task_of(const std::string& task_flag, bool flag_given, const json& settings, const std::string& path) {
  if (!settings.is_object() || !settings.contains("task")) return task_flag;
  CAST_CHECK_USAGE(settings["task"].is_string(), "config file {}: setting 'task' is {}, not a task name", path,
                   files::json_excerpt(settings["task"]));
  const std::string task = settings["task"].get<std::string>();
  CAST_CHECK_USAGE(!flag_given || task == task_flag, "config file {} names task '{}' and --task names '{}': give one",
                   path, task, task_flag);
  const std::vector<std::string>& known = task_names();
  CAST_CHECK_USAGE(std::find(known.begin(), known.end(), task) != known.end(), "config file {}: unknown task '{}' ({})",
                   path, visible(task), fmt::join(known, ", "));
  return task;
}

void apply_settings_file(TrainConfig& c, const json& settings, const std::string& path) {
  try {
    apply_overrides(c, settings, Check::each);
  } catch (const UsageError& e) {  // the setting's message, with the file it came from
    throw UsageError(fmt::format("config file {}: {}", path, e.what()));
  }
}

std::string naming_settings_file(const std::string& message, const json& file, const json& flags,
                                 const std::string& path) {
  if (path.empty() || !file.is_object() || message.rfind("config file ", 0) == 0) return message;
  for (size_t at = message.find("setting '"); at != std::string::npos; at = message.find("setting '", at + 1)) {
    const size_t from = at + 9, to = message.find('\'', from);
    if (to == std::string::npos) break;
    const std::string key = message.substr(from, to - from);
    if (!file.contains(key) || (flags.is_object() && flags.contains(key))) continue;
    // at the message's start, or after a prefix ending ": " (a variant's, a run's)
    if (at != 0 && (at < 2 || message.compare(at - 2, 2, ": ") != 0)) continue;
    return message.substr(0, at) + fmt::format("config file {}: ", path) + message.substr(at);
  }
  // a relation between settings that names the file's setting second ("setting 'weight-decay'
  // is 0.01: with 'lr' 1e+308 ..."): the file is named before the whole message
  for (const auto& [key, value] : file.items())
    if ((!flags.is_object() || !flags.contains(key)) && message.find("'" + key + "'") != std::string::npos)
      return fmt::format("config file {}: {}", path, message);
  return message;
}

void rethrow_naming_settings_file(const UsageError& e, const json& file, const json& flags, const std::string& path) {
  const std::string said = naming_settings_file(e.what(), file, flags, path);
  if (said == e.what()) throw;
  throw UsageError(said);
}

}  // namespace cast::train
