#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <numeric>
#include <set>

#include "autograd/tape.h"
#include "ops/adamw.h"
#include "ops/ops.h"
#include "tensor/device_memory.h"
#include "tensor/files.h"
#include "tensor/philox.h"
#include "tensor/safetensors.h"
#include "train/memory_estimate.h"
#include "train/plot.h"
#include "train/stop.h"
#include "train/training_step.h"
#ifdef CAST_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace cast::train {

using json = nlohmann::json;

// ---------------------------------------------------------------- configuration
json TrainConfig::to_json() const {
  return json{{"task", task}, {"data", data_dir}, {"run", run_dir}, {"steps", steps}, {"batch", batch},
              {"warmup", warmup}, {"log-every", log_every}, {"eval-every", eval_every},
              {"checkpoint-every", checkpoint_every}, {"eval-limit", eval_limit}, {"lr", lr},
              {"weight-decay", weight_decay}, {"clip", clip}, {"schedule", schedule}, {"seed", seed},
              {"eval-best", eval_best}, {"device", device}, {"tf32", tf32},
              {"reference", reference}};
}

TrainConfig preset(const std::string& task) {
  TrainConfig c;
  c.task = task;
  nn::ModelConfig& m = c.model;
  m.attention.mechanism = nn::Mechanism::cast;
  if (task == "listops-short") {  // small enough for a 2-core CPU in a few minutes
    m.vocab = 16, m.max_len = 48, m.dim = 64, m.heads = 4, m.mlp_dim = 128, m.layers = 2, m.classes = 10;
    m.dropout = 0.0;
    c.steps = 1200, c.batch = 32, c.lr = 2e-3, c.warmup = 100, c.schedule = "cosine", c.weight_decay = 0.01;
  } else if (task == "listops") {
    m.vocab = 16, m.max_len = 2000, m.dim = 512, m.heads = 8, m.mlp_dim = 1024, m.layers = 4, m.classes = 10;
    c.steps = 5000, c.batch = 32, c.lr = 0.05, c.warmup = 1000, c.schedule = "rsqrt";
  } else if (task == "text") {
    m.vocab = 257, m.max_len = 4096, m.dim = 256, m.heads = 4, m.mlp_dim = 1024, m.layers = 4, m.classes = 2;
    c.steps = 20000, c.batch = 32, c.lr = 0.05, c.warmup = 8000, c.schedule = "rsqrt";
  } else if (task == "retrieval") {
    m.vocab = 257, m.max_len = 4000, m.dim = 128, m.heads = 4, m.mlp_dim = 512, m.layers = 4, m.classes = 2;
    m.dual = true;
    c.steps = 5000, c.batch = 32, c.lr = 0.05, c.warmup = 8000, c.schedule = "rsqrt";
  } else if (task == "image") {
    m.vocab = 256, m.max_len = 1024, m.dim = 128, m.heads = 8, m.mlp_dim = 128, m.layers = 1, m.classes = 10;
    m.dropout = 0.3, m.learned_positions = true;
    c.steps = 35000, c.batch = 256, c.lr = 5e-4, c.warmup = 1000, c.schedule = "cosine";
  } else if (task == "pathfinder") {
    m.vocab = 256, m.max_len = 1024, m.dim = 32, m.heads = 4, m.mlp_dim = 32, m.layers = 4, m.classes = 2;
    m.cls_pooling = false;
    c.steps = 62000, c.batch = 512, c.lr = 1e-3, c.warmup = 1000, c.schedule = "cosine";
  } else if (task == "pathx") {
    m.vocab = 256, m.max_len = 16384, m.dim = 32, m.heads = 2, m.mlp_dim = 32, m.layers = 1, m.classes = 2;
    m.cls_pooling = false;
    c.steps = 62000, c.batch = 32, c.lr = 1e-3, c.warmup = 1000, c.schedule = "cosine";
  } else if (task == "fashion-mnist") {
    m.vocab = 256, m.max_len = 784, m.dim = 64, m.heads = 4, m.mlp_dim = 128, m.layers = 1, m.classes = 10;
    m.cls_pooling = false, m.learned_positions = true;
    c.steps = 3000, c.batch = 64, c.lr = 1e-3, c.warmup = 200, c.schedule = "cosine";
  } else if (task == "fashion-mnist-14") {  // the comparison preset of docs/results.md: 196 tokens
    m.vocab = 256, m.max_len = 196, m.dim = 64, m.heads = 4, m.mlp_dim = 128, m.layers = 1, m.classes = 10;
    m.cls_pooling = false, m.learned_positions = true, m.dropout = 0.0;
    c.steps = 2000, c.batch = 64, c.lr = 2e-3, c.warmup = 100, c.schedule = "cosine", c.eval_every = 500;
  } else {
    throw UsageError(fmt::format("unknown task '{}' (listops-short, listops, text, retrieval, image, pathfinder, pathx, "
                            "fashion-mnist, fashion-mnist-14)", task));
  }
  return c;
}

// An integer setting: a JSON integer that fits int64. A float such as 6.7e24 is refused here
// (converting it to an integer is undefined behaviour; the fuzzer found it).
static int64_t integer_setting(const std::string& key, const json& v) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
    throw UsageError(fmt::format("setting '{}' is {}: it must be an integer", key, v.dump()));
  return v.get<int64_t>();
}

// One of the words a choice setting accepts, or a usage error naming the setting.
static std::string choice(const std::string& key, const json& value, std::initializer_list<const char*> words) {
  const std::string v = value.get<std::string>();
  std::string list;
  for (const char* w : words) {
    if (v == w) return v;
    list += (list.empty() ? "" : " | ") + std::string(w);
  }
  throw UsageError(fmt::format("setting '{}' is '{}': it must be one of {}", key, v, list));
}

// Every numeric setting within its range, checked where settings enter (flags, a JSON file, a
// checkpoint): one line naming the setting, its value and what it accepts.
void validate(const TrainConfig& c) {
  const nn::ModelConfig& m = c.model;
  const nn::AttentionConfig& a = m.attention;
  auto in_range = [](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) throw UsageError(fmt::format("setting '{}' is {}: it must be in [{}, {}]", key, v, lo, hi));
  };
  constexpr int64_t kBig = int64_t{1} << 40;
  in_range("steps", c.steps, 0, kBig);
  in_range("batch", c.batch, 1, 1 << 20);
  in_range("warmup", c.warmup, 0, kBig);
  in_range("log-every", c.log_every, 1, kBig);
  in_range("eval-every", c.eval_every, 0, kBig);
  in_range("checkpoint-every", c.checkpoint_every, 0, kBig);  // 0: at the end only
  in_range("eval-limit", c.eval_limit, 0, kBig);
  in_range("max-len", m.max_len, 1, 1 << 22);
  in_range("vocab", m.vocab, 1, 1 << 24);  // a checkpoint's sizes are input: checked before any allocation
  in_range("classes", m.classes, 1, 1 << 20);
  in_range("dim", m.dim, 1, 1 << 16);
  in_range("heads", m.heads, 1, 1024);
  in_range("mlp-dim", m.mlp_dim, 1, 1 << 18);
  in_range("layers", m.layers, 1, 1024);
  in_range("clusters", a.clusters, 0, 1 << 16);
  in_range("cluster-size", a.cluster_size, 0, 1 << 22);
  in_range("topk", a.topk, 1, 1 << 22);
  in_range("bits", a.bits, 1, 63);
  in_range("iterations", a.iterations, 0, 100000);
  if (m.dim % m.heads != 0)
    throw UsageError(fmt::format("setting 'dim' is {}: it must be a multiple of 'heads' ({})", m.dim, m.heads));
  auto positive = [](const char* key, double v, bool zero_ok) {
    if (!std::isfinite(v) || v < 0 || (!zero_ok && v == 0))
      throw UsageError(fmt::format("setting '{}' is {}: it must be a {} number", key, v, zero_ok ? "non-negative" : "positive"));
  };
  positive("lr", c.lr, false);
  positive("weight-decay", c.weight_decay, true);
  positive("clip", c.clip, true);
  if (!(m.dropout >= 0 && m.dropout < 1))
    throw UsageError(fmt::format("setting 'dropout' is {}: it must be in [0, 1)", m.dropout));
}

void apply_overrides(TrainConfig& c, const json& j) {
  CAST_CHECK(j.is_object(), "config: expected a JSON object");
  nn::ModelConfig& m = c.model;
  nn::AttentionConfig& a = m.attention;
  for (auto& [key, value] : j.items()) {
    try {
      if (key == "task") continue;  // chosen before the preset
      else if (key == "data") c.data_dir = value.get<std::string>();
      else if (key == "run") c.run_dir = value.get<std::string>();
      else if (key == "steps") c.steps = integer_setting(key, value);
      else if (key == "batch") c.batch = integer_setting(key, value);
      else if (key == "warmup") c.warmup = integer_setting(key, value);
      else if (key == "log-every") c.log_every = integer_setting(key, value);
      else if (key == "eval-every") c.eval_every = integer_setting(key, value);
      else if (key == "checkpoint-every") c.checkpoint_every = integer_setting(key, value);
      else if (key == "eval-limit") c.eval_limit = integer_setting(key, value);
      else if (key == "lr") c.lr = value.get<double>();
      else if (key == "weight-decay") c.weight_decay = value.get<double>();
      else if (key == "clip") c.clip = value.get<double>();
      else if (key == "schedule") c.schedule = choice(key, value, {"rsqrt", "cosine", "constant"});
      else if (key == "seed") {
        const int64_t seed = integer_setting(key, value);
        if (seed < 0) throw UsageError(fmt::format("setting 'seed' is {}: it must be at least 0", seed));
        c.seed = m.seed = static_cast<uint64_t>(seed);
      }
      else if (key == "eval-best") c.eval_best = value.get<bool>();
      else if (key == "device") c.device = choice(key, value, {"auto", "cpu", "cuda"});
      else if (key == "tf32") c.tf32 = value.get<bool>();
      else if (key == "reference") c.reference = value.get<bool>();
      else if (key == "max-len") m.max_len = integer_setting(key, value);
      else if (key == "dim") m.dim = integer_setting(key, value);
      else if (key == "heads") m.heads = integer_setting(key, value);
      else if (key == "mlp-dim") m.mlp_dim = integer_setting(key, value);
      else if (key == "layers") m.layers = integer_setting(key, value);
      else if (key == "dropout") m.dropout = value.get<double>();
      else if (key == "positions") m.learned_positions = choice(key, value, {"sinusoidal", "learned"}) == "learned";
      else if (key == "pooling") m.cls_pooling = choice(key, value, {"cls", "mean"}) == "cls";
      else if (key == "attention") a.mechanism = nn::parse_mechanism(value.get<std::string>());
      else if (key == "clusters") a.clusters = integer_setting(key, value);
      else if (key == "cluster-size") a.cluster_size = integer_setting(key, value);
      else if (key == "clustering") a.single_assignment = choice(key, value, {"topk", "satopk"}) == "satopk";
      else if (key == "f")
        a.f = choice(key, value, {"softmax", "laplace"}) == "laplace" ? ops::AttentionFn::laplace : ops::AttentionFn::softmax;
      else if (key == "summaries") a.summaries = choice(key, value, {"on", "off"}) == "on";
      else if (key == "mix") a.mix_query = choice(key, value, {"affinity", "query"}) == "query";
      else if (key == "cast-heads") a.shared_clustering = choice(key, value, {"per-head", "shared"}) == "shared";
      else if (key == "topk") a.topk = integer_setting(key, value);
      else if (key == "bits") a.bits = integer_setting(key, value);
      else if (key == "iterations") a.iterations = integer_setting(key, value);
      else throw UsageError(fmt::format("config: unknown setting '{}'", key));
    } catch (const json::exception& e) {
      throw UsageError(fmt::format("config: setting '{}' has the wrong type: {}", key, value.dump()));
    }
  }
  validate(c);
}

std::string setting_value(const TrainConfig& c, const std::string& key) {
  const nn::ModelConfig& m = c.model;
  const nn::AttentionConfig& a = m.attention;
  if (key == "data") return c.data_dir.empty() ? "the task's folder under data/" : c.data_dir;
  if (key == "run") return c.run_dir.empty() ? "runs/<task>-<attention>" : c.run_dir;
  if (key == "steps") return std::to_string(c.steps);
  if (key == "batch") return std::to_string(c.batch);
  if (key == "warmup") return std::to_string(c.warmup);
  if (key == "log-every") return std::to_string(c.log_every);
  if (key == "eval-every") return std::to_string(c.eval_every);
  if (key == "checkpoint-every") return std::to_string(c.checkpoint_every);
  if (key == "eval-limit") return std::to_string(c.eval_limit);
  if (key == "lr") return fmt::format("{:g}", c.lr);
  if (key == "weight-decay") return fmt::format("{:g}", c.weight_decay);
  if (key == "clip") return fmt::format("{:g}", c.clip);
  if (key == "schedule") return c.schedule;
  if (key == "seed") return std::to_string(c.seed);
  if (key == "device") return c.device;
  if (key == "max-len") return std::to_string(m.max_len);
  if (key == "dim") return std::to_string(m.dim);
  if (key == "heads") return std::to_string(m.heads);
  if (key == "mlp-dim") return std::to_string(m.mlp_dim);
  if (key == "layers") return std::to_string(m.layers);
  if (key == "dropout") return fmt::format("{:g}", m.dropout);
  if (key == "positions") return m.learned_positions ? "learned" : "sinusoidal";
  if (key == "pooling") return m.cls_pooling ? "cls" : "mean";
  if (key == "attention") return nn::mechanism_name(a.mechanism);
  if (key == "clusters") return std::to_string(a.clusters);
  if (key == "cluster-size") return std::to_string(a.cluster_size);
  if (key == "clustering") return a.single_assignment ? "satopk" : "topk";
  if (key == "f") return a.f == ops::AttentionFn::laplace ? "laplace" : "softmax";
  if (key == "summaries") return a.summaries ? "on" : "off";
  if (key == "mix") return a.mix_query ? "query" : "affinity";
  if (key == "cast-heads") return a.shared_clustering ? "shared" : "per-head";
  if (key == "topk") return std::to_string(a.topk);
  if (key == "bits") return std::to_string(a.bits);
  if (key == "iterations") return std::to_string(a.iterations);
  throw Error(fmt::format("no setting '{}'", key));
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"listops-short", "listops", "text", "retrieval", "image",
                                                 "pathfinder", "pathx", "fashion-mnist",
                                                 "fashion-mnist-14"};
  return names;
}

double learning_rate(const TrainConfig& c, int64_t step) {
  const double s = static_cast<double>(step), w = static_cast<double>(std::max<int64_t>(c.warmup, 1));
  if (c.schedule == "rsqrt") return c.lr * std::min(1.0, s / w) / std::sqrt(std::max(s, w));
  if (c.schedule == "constant") return c.lr * std::min(1.0, s / w);
  if (step <= c.warmup) return c.lr * s / w;
  const double progress = (s - c.warmup) / std::max(1.0, static_cast<double>(c.steps - c.warmup));
  return c.lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, progress)));
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") {
    CAST_CHECK(device_memory::cuda_available(), "--device cuda: no CUDA GPU is available");
    return Device::cuda;
  }
  CAST_CHECK(name == "auto", "--device must be auto, cpu or cuda, got '{}'", name);
  return device_memory::cuda_available() ? Device::cuda : Device::cpu;
}

data::TaskData load_task(const TrainConfig& c, bool generate_if_missing) {
  const std::string& t = c.task;
  std::string dir = c.data_dir;
  const int64_t max_len = c.model.max_len;
  if (t == "listops-short" || t == "listops") {
    if (dir.empty()) dir = t == "listops" ? "data/listops-1000" : "data/listops-short";
    if (generate_if_missing && t == "listops-short" && !std::filesystem::exists(dir + "/basic_train.tsv")) {
      fmt::print("generating short ListOps into {}\n", dir);
      data::generate_listops(dir, data::ListOpsSpec::short_cpu(), 1);
    }
    return data::load_listops(dir, max_len);
  }
  if (t == "text") return data::load_imdb(dir.empty() ? "data/aclImdb" : dir, max_len);
  if (t == "retrieval") return data::load_aan(dir.empty() ? "data/aan" : dir, max_len);
  if (t == "image") return data::load_cifar10(dir.empty() ? "data/cifar-10-batches-bin" : dir);
  if (t == "fashion-mnist" || t == "fashion-mnist-14")
    return data::load_fashion_mnist(dir.empty() ? data::default_fashion_mnist_dir() : dir, t == "fashion-mnist" ? 1 : 2);
  if (t == "pathfinder" || t == "pathx") {
    if (dir.empty()) dir = t == "pathx" ? "data/pathx128" : "data/pathfinder32";
    return data::load_pathfinder(dir);
  }
  throw Error(fmt::format("unknown task '{}'", t));
}

std::string run_title(const TrainConfig& c) {
  return fmt::format("{}, {} attention, {} layer{}, D {}: {} steps of batch {}", c.task,
                     nn::mechanism_name(c.model.attention.mechanism), c.model.layers, c.model.layers == 1 ? "" : "s",
                     c.model.dim, c.steps, c.batch);
}

// ---------------------------------------------------------------- evaluation
EvalResult evaluate(nn::Transformer& model, const data::TaskData& task, const std::vector<data::Example>& split,
                    int64_t batch, int64_t limit, Device device) {
  autograd::NoGradGuard no_grad;
  EvalResult r;
  const int64_t n = limit > 0 ? std::min<int64_t>(limit, split.size()) : static_cast<int64_t>(split.size());
  double loss_sum = 0, correct = 0;
  for (int64_t start = 0; start < n; start += batch) {
    std::vector<int64_t> idx(std::min(batch, n - start));
    std::iota(idx.begin(), idx.end(), start);
    nn::Batch b = data::make_batch(task, split, idx, DType::f32, device);
    Tensor logits = model.forward(b, false);
    loss_sum += ops::cross_entropy(logits, b.labels).item() * static_cast<double>(idx.size());
    Tensor predicted = ops::topk(logits, 1);
    auto p = predicted.to_double_vector(), y = b.labels.to_double_vector();
    for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
  }
  r.examples = n;
  r.majority = data::majority_rate(split, task.classes, n);
  r.loss = n ? loss_sum / n : 0;
  r.accuracy = n ? correct / n : 0;
  return r;
}

// ---------------------------------------------------------------- checkpoints
// The first NaN or infinity among a file's floating-point tensors: "'param/x' holds nan at
// element 3", or "" when every value is finite.
std::string non_finite_in(const std::map<std::string, Tensor>& tensors) {
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;  // a structured binding cannot be captured by clang 14
    const Tensor& t = entry.second;
    const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
    auto scan = [&](const auto* x) -> std::string {
      for (int64_t i = 0; i < host.numel(); ++i)
        if (!std::isfinite(x[i]))
          return fmt::format("'{}' holds {} at element {}", name, std::isnan(x[i]) ? "nan" : x[i] > 0 ? "inf" : "-inf", i);
      return "";
    };
    std::string found;
    if (host.dtype() == DType::f32) found = scan(host.data<float>());
    else if (host.dtype() == DType::f64) found = scan(host.data<double>());
    if (!found.empty()) return found;
  }
  return "";
}

static const char* kFormat = "cast-checkpoint-1";

void save_checkpoint(const std::string& path, const TrainConfig& c, nn::Transformer& model,
                     const std::vector<Tensor>& m, const std::vector<Tensor>& v, int64_t step, double best_val,
                     const RunCost& cost) {
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
                                             {"model", c.model.to_json().dump()},
                                             {"train", c.to_json().dump()},
                                             {"step", std::to_string(step)},
                                             {"rng_offset", std::to_string(model.rng_offset)},
                                             {"best_val", fmt::format("{:.17g}", best_val)},
                                             {"wall_seconds", fmt::format("{:.17g}", cost.wall_seconds)},
                                             {"step_seconds", fmt::format("{:.17g}", cost.step_seconds)},
                                             {"peak_bytes", std::to_string(cost.peak_bytes)}};
  // A checkpoint is only ever written finite, so the one on disk is always a good one.
  const std::string damage = non_finite_in(tensors);
  if (!damage.empty()) throw NonFiniteCheckpoint(fmt::format("{}: not written: {}", path, damage));
  write_safetensors(path, tensors, meta, "checkpoint", files::Link::refuse);
}

Checkpoint read_checkpoint_header(const std::string& path) {
  TensorFile f = read_safetensors(path, "checkpoint");
  auto get = [&](const char* key) {
    auto it = f.metadata.find(key);
    CAST_CHECK(it != f.metadata.end(), "{}: not a cast checkpoint (no '{}' metadata)", path, key);
    return it->second;
  };
  CAST_CHECK(get("format") == kFormat, "{}: unsupported checkpoint format '{}'", path, get("format"));
  Checkpoint ck;
  try {
    const json train = files::parse_json(get("train"), "'train' metadata");
    ck.config.task = train.at("task").get<std::string>();
    apply_overrides(ck.config, train);
    ck.config.model = nn::ModelConfig::from_json(files::parse_json(get("model"), "'model' metadata"));
    validate(ck.config);  // a checkpoint's sizes are input too: `layers: 1000000` is refused here
    // whole-string numbers: "12oops" is no step
    auto whole = [&](const char* key, auto parse) {
      const std::string text = get(key);
      size_t used = 0;
      const auto value = parse(text, &used);
      CAST_CHECK(used == text.size() && !text.empty(), "'{}' is '{}', not a number", key, text);
      return value;
    };
    ck.step = whole("step", [](const std::string& t, size_t* u) { return std::stoll(t, u); });
    ck.rng_offset = whole("rng_offset", [](const std::string& t, size_t* u) { return std::stoull(t, u); });
    ck.best_val = whole("best_val", [](const std::string& t, size_t* u) { return std::stod(t, u); });
    if (f.metadata.count("wall_seconds")) {
      ck.cost.wall_seconds = whole("wall_seconds", [](const std::string& t, size_t* u) { return std::stod(t, u); });
      ck.cost.step_seconds = whole("step_seconds", [](const std::string& t, size_t* u) { return std::stod(t, u); });
      ck.cost.peak_bytes = whole("peak_bytes", [](const std::string& t, size_t* u) { return std::stoll(t, u); });
      CAST_CHECK(std::isfinite(ck.cost.wall_seconds) && ck.cost.wall_seconds >= 0 &&
                     std::isfinite(ck.cost.step_seconds) && ck.cost.step_seconds >= 0 && ck.cost.peak_bytes >= 0,
                 "'wall_seconds', 'step_seconds' or 'peak_bytes' is negative or not finite");
    }
    CAST_CHECK(ck.step >= 0 && ck.step <= ck.config.steps, "'step' is {}, outside [0, {}] (the run's steps)", ck.step,
               ck.config.steps);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: corrupt checkpoint metadata: {}", path, files::json_message(e)));
  }
  return ck;
}

// The first field (nested ones as 'attention.clusters') where two model configs differ.
static std::string first_difference(const json& theirs, const json& mine, const std::string& prefix) {
  for (auto& [k, val] : mine.items()) {
    const bool has = theirs.contains(k);
    if (has && theirs[k].is_object() && val.is_object() && theirs[k] != val)
      return first_difference(theirs[k], val, prefix + k + ".");
    if (!has || theirs[k] != val)
      return fmt::format("'{}{}' is {} in the checkpoint but {} in this model", prefix, k,
                         has ? theirs[k].dump() : "missing", val.dump());
  }
  return "model config";
}

std::string checkpoint_damage(const std::string& path) {
  return non_finite_in(read_safetensors(path, "checkpoint").tensors);
}

void load_checkpoint(const std::string& path, nn::Transformer& model, std::vector<Tensor>* m, std::vector<Tensor>* v) {
  TensorFile f = read_safetensors(path, "checkpoint");
  // A NaN weight evaluates to a plausible-looking accuracy and poisons a resumed run: every
  // tensor is checked, not only those this load uses.
  const std::string damage = non_finite_in(f.tensors);
  CAST_CHECK(damage.empty(), "{}: {}: the checkpoint holds non-finite values and cannot be used", path, damage);
  // Compared as parsed values, not as text: a reformatted but equal config is the same model.
  CAST_CHECK(f.metadata.count("model"), "checkpoint {}: not a cast checkpoint (no 'model' metadata)", path);
  const json theirs =
      nn::ModelConfig::from_json(files::parse_json(f.metadata.at("model"), path + ": model config")).to_json();
  const json mine = model.config().to_json();
  if (theirs != mine)
    throw Error(fmt::format("{}: checkpoint does not match the model: {}", path, first_difference(theirs, mine, "")));
  nn::ParamList params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    const Tensor& stored_t = f.get("param/" + name, DType::f32, t->shape());
    t->copy_from(stored_t.to(t->device()));
    if (m) (*m)[i].copy_from(f.get("adam.m/" + name, DType::f32, t->shape()).to(t->device()));
    if (v) (*v)[i].copy_from(f.get("adam.v/" + name, DType::f32, t->shape()).to(t->device()));
  }
  model.rng_offset = std::stoull(f.metadata.at("rng_offset"));
}

TrainedRun open_trained_run(const std::string& path, const std::string& data_dir, Device device) {
  TrainedRun run;
  run.checkpoint = read_checkpoint_header(path);
  if (!data_dir.empty()) run.checkpoint.config.data_dir = data_dir;
  run.model = std::make_unique<nn::Transformer>(run.checkpoint.config.model, DType::f32, device);
  load_checkpoint(path, *run.model, nullptr, nullptr);
  run.task = load_task(run.checkpoint.config, false);
  return run;
}

// ---------------------------------------------------------------- resuming
namespace {

// Settings a run may change on the way: when it stops, what it logs and evaluates, where it
// reads data and writes files, what runs it. Every other setting shapes the model or its
// optimisation, which the checkpoint fixes.
bool may_change_on_resume(const std::string& key) {
  static const std::set<std::string> keys = {"steps", "log-every", "eval-every", "checkpoint-every", "eval-limit",
                                              "eval-best", "data", "run", "device", "tf32", "reference"};
  return keys.count(key) > 0;
}

json every_setting(const TrainConfig& c) {
  json j = c.to_json();
  j["task"] = c.task;
  j["model"] = c.model.to_json();
  return j;
}

}  // namespace

TrainConfig resume_config(const std::string& checkpoint, const json& changes) {
  CAST_CHECK_USAGE(changes.is_object(), "resume settings: expected a JSON object");
  const Checkpoint ck = read_checkpoint_header(checkpoint);
  TrainConfig c = ck.config;
  // The folder stored inside is where the run was trained: this file may be a copy of it,
  // and that run is not to be touched.
  c.run_dir = std::filesystem::path(checkpoint).parent_path().string();
  if (c.run_dir.empty()) c.run_dir = ".";
  std::string changeable;
  for (const char* k : {"steps", "log-every", "eval-every", "checkpoint-every", "eval-limit", "eval-best", "data",
                        "run", "device", "tf32", "reference"})
    changeable += (changeable.empty() ? "" : ", ") + std::string(k);
  for (auto& [key, value] : changes.items()) {
    if (key == "task") {
      CAST_CHECK_USAGE(value.is_string() && value.get<std::string>() == c.task,
                       "setting 'task' cannot change when resuming: {} is a {} run", checkpoint, c.task);
      continue;
    }
    TrainConfig changed = c;
    apply_overrides(changed, json{{key, value}});
    if (may_change_on_resume(key)) {
      c = changed;
    } else if (every_setting(changed) != every_setting(c)) {
      throw UsageError(fmt::format("setting '{}' cannot change when resuming: {} was trained with {}, not {}; only {} "
                                   "may change (start a new run for other settings)",
                                   key, checkpoint, setting_value(c, key), setting_value(changed, key), changeable));
    }
  }
  CAST_CHECK_USAGE(!changes.contains("steps") || c.steps > ck.step,
                   "setting 'steps' is {}: a resumed run must end after its checkpoint's step {} ({})", c.steps, ck.step,
                   checkpoint);
  return c;
}

// ---------------------------------------------------------------- the loop
namespace {

// The data order: epoch e visits the training set in a Philox permutation drawn from (seed, e),
// so the batch of any step is known from the step alone (and a resumed run sees the same data).
class Sampler {
 public:
  Sampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> batch(int64_t step, int64_t size) {  // step is 1-based
    std::vector<int64_t> out;
    for (int64_t j = 0; j < size; ++j) {
      const int64_t global = (step - 1) * size + j, epoch = global / n_;
      if (epoch != epoch_) shuffle(epoch);
      out.push_back(order_[global % n_]);
    }
    return out;
  }

 private:
  void shuffle(int64_t epoch) {
    order_.resize(n_);
    std::iota(order_.begin(), order_.end(), 0);
    const uint64_t key = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch);
    for (int64_t i = n_ - 1; i > 0; --i)
      std::swap(order_[i], order_[std::min<int64_t>(i, static_cast<int64_t>(philox::uniform(key, i) * (i + 1)))]);
    epoch_ = epoch;
  }
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// Writes to `out` the lines of the metrics file `path` of steps up to `last_step` (atomically;
// `out` may be `path`). No file at `path`: `out` starts empty.
void keep_metrics_until(const std::string& path, int64_t last_step, const std::string& out) {
  std::istringstream in(files::exists(path) ? files::read_file(path, "metrics file") : std::string());
  std::string kept, line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= last_step)
      kept += line + '\n';
  }
  files::write_atomic(out, kept, "metrics file", files::Link::refuse);
}

std::string folder_of(const std::string& file) {
  const std::string folder = std::filesystem::path(file).parent_path().string();
  return folder.empty() ? "." : folder;
}

// A run resumed into a new folder takes its best checkpoint along, so that --eval-best there
// still finds the best model of the whole run.
void copy_best(const std::string& checkpoint, const std::string& run_dir) {
  const std::string best = folder_of(checkpoint) + "/best.safetensors";
  if (!files::exists(best)) return;
  files::write_atomic(run_dir + "/best.safetensors", files::read_file(best, "best checkpoint"), "best checkpoint",
                      files::Link::refuse);
}

// What a stopped run can go back to, said only of a checkpoint read back and found finite.
std::string last_good_checkpoint(const std::string& path) {
  if (!files::exists(path)) return "No checkpoint was written yet";
  try {
    const Checkpoint ck = read_checkpoint_header(path);
    const std::string damage = checkpoint_damage(path);
    if (damage.empty()) return fmt::format("The last good checkpoint is {} (step {}, every value checked finite)", path, ck.step);
    return fmt::format("{} holds non-finite values ({}): no good checkpoint is left", path, damage);
  } catch (const Error& e) {
    return fmt::format("{} cannot be read back ({}): no good checkpoint is left", path, e.what());
  }
}

}  // namespace

void reset_peak_memory(Device device) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) return cuda::reset_peak_memory();
#endif
  (void)device;
  reset_host_peak_memory();
}

size_t peak_memory(Device device) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) return cuda::memory_stats().peak;
#endif
  (void)device;
  return host_memory_stats().peak;
}

TrainResult run_training(TrainConfig c, const std::string& resume_from, int64_t stop_after, bool quiet) {
  // Data is generated only for a new run in the default folder: a resumed run's stored folder,
  // or a folder the user named, is read, never created (a missing one is an error).
  const bool may_generate = resume_from.empty() && c.data_dir.empty();
  const data::TaskData task = load_task(c, may_generate);
  return train_on(c, task, resume_from, stop_after, quiet);
}

TrainResult train_on(TrainConfig c, const data::TaskData& task, const std::string& resume_from, int64_t stop_after,
                     bool quiet) {
  int64_t start_step = 0;
  double best_val = -1;
  RunCost earlier;  // what the processes before this one spent
  if (!resume_from.empty()) {
    Checkpoint ck = read_checkpoint_header(resume_from);  // a different model is refused by load_checkpoint
    start_step = ck.step;
    best_val = ck.best_val;
    earlier = ck.cost;
  }
  CAST_CHECK_USAGE(c.steps >= start_step, "setting 'steps' is {}: the checkpoint {} is already at step {}", c.steps,
                   resume_from, start_step);
  CAST_CHECK_USAGE(!c.eval_best || c.eval_every > 0,
                   "setting 'eval-best' needs 'eval-every' above 0: the best checkpoint is chosen at the validations "
                   "during training");
  const Device device = resolve_device(c.device);
  ops::set_allow_tf32(c.tf32);
  ops::set_cpu_gemm(c.reference ? ops::CpuGemm::loops : ops::CpuGemm::blas);
  c.model.attention.fused = !c.reference;
  if (c.run_dir.empty()) c.run_dir = fmt::format("runs/{}-{}", c.task, nn::mechanism_name(c.model.attention.mechanism));
  {  // the run folder must take files before any step is spent
    files::make_writable_folder(c.run_dir, "run folder");
    for (const char* name : {"/checkpoint.safetensors", "/best.safetensors", "/summary.json", "/curves.svg"})
      files::output_target(c.run_dir + name, "run file", files::Link::refuse);  // a FIFO or link there: refused now
  }
  const std::string ckpt_path = c.run_dir + "/checkpoint.safetensors";
  // Resuming into the checkpoint's own folder continues that run; any other folder is a new
  // home, under the same rule as a new run's.
  const bool continues_in_place = !resume_from.empty() && files::same_file(folder_of(resume_from), c.run_dir);
  if (!continues_in_place && std::filesystem::exists(ckpt_path)) {
    CAST_CHECK(c.overwrite, "run folder {} already holds a run ({}): continue it with --resume {}, choose another "
               "--run, or pass --overwrite to replace it", c.run_dir, ckpt_path, ckpt_path);
    for (const char* stale : {"/best.safetensors", "/summary.json", "/curves.svg"})
      std::filesystem::remove(c.run_dir + stale);  // the old run's, never to be mistaken for the new one's
  }
  CAST_CHECK(!task.train.empty(), "task {}: the training split has no examples (check the data folder)", task.name);

  CAST_CHECK(task.vocab <= c.model.vocab && task.classes == c.model.classes && task.dual == c.model.dual,
             "task {} (vocab {}, {} classes) does not fit the model (vocab {}, {} classes)", task.name, task.vocab,
             task.classes, c.model.vocab, c.model.classes);
  require_memory(training_step_bytes(c.model, c.batch, std::min(c.model.max_len, task.max_len), device == Device::cuda),
                 device, fmt::format("a training step of batch {} at length {}", c.batch,
                                     std::min(c.model.max_len, task.max_len)),
                 "lower --batch or --max-len");
  nn::Transformer model(c.model, DType::f32, device);
  nn::ParamList params = model.parameters();
  std::vector<Tensor> m, v;
  for (auto& [name, t] : params) {
    m.push_back(Tensor::zeros(t->shape(), t->dtype(), device));
    v.push_back(Tensor::zeros(t->shape(), t->dtype(), device));
  }
  if (!resume_from.empty()) load_checkpoint(resume_from, model, &m, &v);

  const bool terminal = !quiet && isatty(STDOUT_FILENO);
  // A resumed run continues the metrics of its checkpoint's step: lines an interrupted process
  // wrote after that step are dropped, so no step appears twice. In a new folder it starts
  // from the checkpoint's folder's lines, which are read, never written.
  if (start_step > 0) {
    keep_metrics_until(folder_of(resume_from) + "/metrics.jsonl", start_step, c.run_dir + "/metrics.jsonl");
    if (!continues_in_place) copy_best(resume_from, c.run_dir);
  }
  files::AppendFile metrics(c.run_dir + "/metrics.jsonl", start_step == 0, "metrics file");
  Sampler sampler(static_cast<int64_t>(task.train.size()), c.seed);
  TrainResult result;
  const auto t0 = std::chrono::steady_clock::now();
  reset_peak_memory(device);
  double step_seconds = 0;  // this process's, steps only
  auto cost_now = [&] {
    RunCost cost = earlier;
    cost.wall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cost.step_seconds += step_seconds;
    cost.peak_bytes = std::max<int64_t>(cost.peak_bytes, static_cast<int64_t>(peak_memory(device)));
    return cost;
  };
  double window_loss = 0, window_correct = 0, window_examples = 0, window_tokens = 0;
  TrainingStep training(model, params, m, v, std::max<int64_t>(c.log_every, 1));
  auto window_start = t0;
  int64_t step = start_step;

  // Every checkpoint is checked finite before it is written: an update that overflowed stops
  // the run here, and the file on disk stays the last good one.
  auto save = [&](const std::string& path) {
    try {
      save_checkpoint(path, c, model, m, v, step, best_val, cost_now());
    } catch (const NonFiniteCheckpoint& e) {
      throw Error(fmt::format("step {}: the update made a parameter or moment non-finite ({}); training stopped. {}",
                              step, e.what(), last_good_checkpoint(ckpt_path)));
    }
  };
  auto run_eval = [&](const char* split_name, const std::vector<data::Example>& split) {
    EvalResult r = evaluate(model, task, split, c.batch, c.eval_limit, device);
    metrics.append(json{{"step", step}, {"split", split_name}, {"loss", r.loss}, {"accuracy", r.accuracy}}.dump() + '\n');
    return r;
  };

  while (step < c.steps && (stop_after <= 0 || step - start_step < stop_after)) {
    ++step;
    const auto step_start = std::chrono::steady_clock::now();
    nn::Batch batch = data::make_batch(task, task.train, sampler.batch(step, c.batch), DType::f32, device);
    training.compute(batch, step);
    // The host reads the steps' statistics (one copy) before it logs, evaluates or saves, and
    // always on the host, where reading costs nothing: so a non-finite loss or gradient norm is
    // caught before this step's update and before any checkpoint could hold its damage.
    const bool log_step = step % c.log_every == 0 || step == c.steps;
    const bool eval_step = c.eval_every > 0 && step % c.eval_every == 0;
    const bool save_step = c.checkpoint_every > 0 && step % c.checkpoint_every == 0;
    const bool last_step = stop_after > 0 && step - start_step >= stop_after;
    const int stop = stop_signal();  // polled once a step: this step is finished and saved first
    if (device != Device::cuda || log_step || eval_step || save_step || last_step || stop) {
      for (const StepRecord& r : training.read()) {
        if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
          autograd::clear_tape();
          const bool loss_bad = !std::isfinite(r.loss);
          const double bad = loss_bad ? r.loss : r.grad_norm;
          throw Error(fmt::format("step {}: the {} is {}; training stopped{}. {}", r.step,
                                  loss_bad ? "loss" : "gradient norm", std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf",
                                  r.step == step ? " before the update" : fmt::format(" at step {}", step),
                                  last_good_checkpoint(ckpt_path)));
        }
        window_loss += r.loss * r.examples;
        window_correct += r.correct;
        window_examples += r.examples;
        window_tokens += r.tokens;
        result.losses.push_back(r.loss);
      }
    }
    ops::AdamWStep s{learning_rate(c, step), c.beta1, c.beta2, c.eps, 0.0, step};
    training.update(s, c.weight_decay, c.clip);
    step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (step % c.log_every == 0 || step == c.steps) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - window_start).count();
      const double elapsed = std::chrono::duration<double>(now - t0).count();
      const double eta = elapsed / std::max<int64_t>(1, step - start_step) * (c.steps - step);
      const double l = window_loss / window_examples, a = window_correct / window_examples;
      metrics.append(json{{"step", step}, {"split", "train"}, {"loss", l}, {"accuracy", a}, {"lr", s.lr},
                          {"tokens_per_s", window_tokens / std::max(dt, 1e-9)}}.dump() + '\n');
      if (!quiet) {
        const std::string line = fmt::format("step {:>6}/{}  loss {:.4f}  acc {:5.1f}%  lr {:.2e}  {:.0f} tok/s  ETA {}",
                                             step, c.steps, l, 100 * a, s.lr, window_tokens / std::max(dt, 1e-9),
                                             format_duration(eta));
        if (terminal) fmt::print("\r\033[K{}", line);
        else fmt::print("{}\n", line);
        std::fflush(stdout);
      }
      window_loss = window_correct = window_examples = window_tokens = 0;
      window_start = now;
    }
    if (c.eval_every > 0 && step % c.eval_every == 0) {
      EvalResult r = run_eval("val", task.val);
      if (r.accuracy > best_val) {
        best_val = r.accuracy;
        save(c.run_dir + "/best.safetensors");
      }
      if (!quiet) fmt::print("{}step {}: validation accuracy {:.1f}%\n", terminal ? "\n" : "", step, 100 * r.accuracy);
    }
    if (save_step || stop) save(ckpt_path);
    if (stop) {
      if (terminal) fmt::print("\n");
      throw Interrupted(stop, fmt::format("stopped by {} after step {} of {}: checkpoint {} written", signal_name(stop),
                                          step, c.steps, ckpt_path),
                        "cast train --resume " + shell_quote(ckpt_path));
    }
  }
  if (terminal) fmt::print("\n");
  save(ckpt_path);
  result.steps = step;
  if (stop_after > 0 && step < c.steps) return result;
  if (const int stop = stop_signal())  // training is done and saved; only the evaluation is left
    throw Interrupted(stop, fmt::format("stopped by {} after the last step ({}), before the final evaluation: "
                                        "checkpoint {} written", signal_name(stop), step, ckpt_path),
                      "cast train --resume " + shell_quote(ckpt_path));

  // Only a best checkpoint this run wrote is evaluated as "best": with no validation during
  // training there is none, and the final model is evaluated and named as such.
  const bool evaluate_best = c.eval_best && std::filesystem::exists(c.run_dir + "/best.safetensors");
  if (evaluate_best) load_checkpoint(c.run_dir + "/best.safetensors", model, nullptr, nullptr);
  result.val = run_eval("val", task.val);
  result.test = run_eval("test", task.test);
  result.majority = result.test.majority;
  plot_run(c.run_dir + "/curves.svg", run_title(c), read_curves(c.run_dir), files::Link::refuse);
  const RunCost cost = cost_now();
  const double seconds = cost.wall_seconds;
  json summary = {{"task", c.task}, {"attention", nn::mechanism_name(c.model.attention.mechanism)}, {"steps", step},
                  {"seconds", seconds}, {"step_seconds", step > 0 ? cost.step_seconds / step : 0.0},
                  {"peak_bytes", cost.peak_bytes}, {"device", device_name(device)},
                  {"val_accuracy", result.val.accuracy}, {"test_accuracy", result.test.accuracy},
                  {"val_examples", result.val.examples}, {"test_examples", result.test.examples},
                  {"majority_rate", result.majority}, {"evaluated", evaluate_best ? "best" : "final"}};
  files::write_atomic(c.run_dir + "/summary.json", summary.dump(2) + "\n", "run summary", files::Link::refuse);
  if (!quiet) {
    fmt::print("done in {}: {} model after {} steps\n", format_duration(seconds), evaluate_best ? "best" : "final", step);
    if (result.val.examples) fmt::print("  validation accuracy {:.1f}%  (loss {:.4f})\n", 100 * result.val.accuracy, result.val.loss);
    else fmt::print("  validation accuracy: no examples\n");
    if (result.test.examples)
      fmt::print("  test accuracy       {:.1f}%  (loss {:.4f})  vs majority class {:.1f}%\n", 100 * result.test.accuracy,
                 result.test.loss, 100 * result.majority);
    else fmt::print("  test accuracy: no examples\n");
    fmt::print("  run folder {}: checkpoint.safetensors, metrics.jsonl, curves.svg, summary.json\n", c.run_dir);
  }
  return result;
}

}  // namespace cast::train
