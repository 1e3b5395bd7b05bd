// Benchmarks. Times are medians over repeated runs after warm-up: CUDA events on the GPU,
// a steady clock on the CPU. Peak memory is what tensors held at most during one
// forward+backward (device bytes from the caching allocator, or host bytes).
#include "commands/commands.h"

#include "commands/attention_options.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <set>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "autograd/tape.h"
#include "train/adamw.h"
#include "ops/attention/full_attention_flash.h"
#include "ops/ops.h"
#include "tensor/files.h"
#include "ops/attention/head_projections.h"
#include "train/run_folder.h"
#include "tensor/precision.h"
#include "train/cli.h"
#include "train/memory_estimate.h"
#include "train/trace.h"
#include "train/trainer.h"
#include "train/training_step.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/full_attention_flash.h"
#include "cuda/runtime.h"
#endif

namespace cast {

namespace {

struct Variant {
  std::string name;
  nn::AttentionConfig config;
};

std::vector<Variant> variants(const std::string& list) {
  std::vector<Variant> out;
  for (const std::string& name : cli::comma_list("mechanisms", list)) {  // none empty, none twice
    Variant v{name, {}};
    if (name == "full") v.config.mechanism = nn::Mechanism::full;
    else if (name == "cast-topk") v.config.mechanism = nn::Mechanism::cast;
    else if (name == "cast-satopk") v.config.mechanism = nn::Mechanism::cast, v.config.single_assignment = true;
    else if (name == "clustered") v.config.mechanism = nn::Mechanism::clustered;
    else if (name == "iclustered") v.config.mechanism = nn::Mechanism::iclustered;
    else
      throw UsageError(
          fmt::format("--mechanisms: unknown '{}' (full, cast-topk, cast-satopk, clustered, iclustered)", name));
    out.push_back(v);
  }
  return out;
}

// A list of lengths (or widths) for --option, each in [1, 2^20], none twice.
std::vector<int64_t> lengths(const std::string& option, const std::string& list) {
  return cli::comma_integers(option, list, 1, int64_t{1} << 20);
}

// A count option within [lo, hi], or a usage error naming it.
int64_t bounded(const cli::Args& args, const std::string& name, int64_t lo, int64_t hi) {
  const int64_t v = args.integer(name);
  if (v < lo || v > hi) throw UsageError(fmt::format("--{} is {}: it must be in [{}, {}]", name, v, lo, hi));
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The 1-minute load average, or −1 where /proc/loadavg cannot be read.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

// A note for figures that cannot be trusted: the machine was busy (load above the thread
// count, this process's own threads included), or the repeats disagree by more than half.
std::string trust_note(const std::vector<double>& times) {
  std::string note;
  const double load = load_average(), threads = omp_get_max_threads();
  if (load > threads + 0.5) note += fmt::format("  [busy machine: load {:.1f} on {} threads]", load, threads);
  if (times.size() >= 3) {
    const auto [lo, hi] = std::minmax_element(times.begin(), times.end());
    if (*hi > 1.5 * *lo) note += fmt::format("  [repeats vary {:.0f}-{:.0f} ms]", *lo, *hi);
  }
  return note;
}

double time_once(Device device, const std::function<void()>& fn) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) return cuda::time_ms(fn);
#endif
  (void)device;
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The GPU's copies, waits and allocations (zero on the CPU).
struct TransferCounts {
  double to_host = 0, to_device = 0, synchronizations = 0, mallocs = 0;
  TransferCounts operator-(const TransferCounts& o) const {
    return {to_host - o.to_host, to_device - o.to_device, synchronizations - o.synchronizations, mallocs - o.mallocs};
  }
  TransferCounts operator/(double n) const { return {to_host / n, to_device / n, synchronizations / n, mallocs / n}; }
};
TransferCounts transfer_counts(Device device) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) {
    const cuda::MemoryStats s = cuda::memory_stats();
    return {double(s.to_host), double(s.to_device), double(s.synchronizations), double(s.device_mallocs)};
  }
#endif
  (void)device;
  return {};
}

// --json FILE: the rows as JSON lines. The path is checked before any work (a folder, a device or
// a read-only folder is one error, exit 1), and the rows are written atomically after each row, so
// an interrupted benchmark keeps the rows it finished: into FILE where it did not exist, else into
// FILE.partial until the last row (an earlier FILE stays whole until this benchmark has all of its
// rows; a Ctrl-C leaves it as it was, with this run's rows beside it), then into FILE.
class JsonLines {
 public:
  static constexpr std::string_view kMark = "\"made_by\":\"cast bench\"";
  JsonLines(std::string path, bool overwrite) : path_(std::move(path)), rows_path_(path_) {
    if (path_.empty()) return;
    files::check_name_fits(path_, "--json", std::string_view(".partial").size());
    // room for FILE.partial, where the rows go while an earlier FILE is kept
    const size_t name = std::filesystem::path(path_).filename().native().size(), most = 255 - 8;
    CAST_CHECK_USAGE(name <= most,
                     "--json {}: the name is too long (its {} bytes leave no room for the .partial its rows go to "
                     "over an earlier file; at most {})",
                     path_, name, most);
    train::check_user_output(path_, "--json", "rows of cast bench", kMark, overwrite);
    if (!files::exists(path_)) return;
    // one benchmark at a time over an earlier FILE: a second would share its partial file
    hold_ = files::Fd(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (hold_.get() >= 0 && ::flock(hold_.get(), LOCK_EX | LOCK_NB) != 0)
      throw Error(fmt::format("--json {}: another cast bench is writing its rows over it (into {}.partial): wait for "
                              "it to end, or choose another path",
                              path_, path_));
    // a name cast chooses, so no --overwrite reaches it: never through a link, and replacing only
    // the rows an earlier benchmark left there
    rows_path_ = path_ + ".partial";
    struct stat st {};
    CAST_CHECK_USAGE(::lstat(rows_path_.c_str(), &st) != 0 || !S_ISLNK(st.st_mode),
                     "--json {}: {} is a symbolic link, where this benchmark writes its rows until its last row "
                     "(never through a link): remove it, or choose another --json",
                     path_, rows_path_);
    files::output_target(rows_path_, "--json", files::Link::refuse);
    train::check_user_output(rows_path_, "--json", "rows of cast bench", kMark, false, "",
                             "this benchmark's rows go there until its last row: move it, or choose another --json");
    fmt::print("--json {}: kept as it is until the last row; the rows go to {} until then\n", path_, rows_path_);
  }
  void add(nlohmann::json row) {
    if (path_.empty()) return;
    row["made_by"] = "cast bench";  // the mark: what a later --json may replace
    if (text_.empty()) row["digest"] = files::kDigestSlot;  // that nobody changed it since
    text_ += row.dump() + '\n';
    write(rows_path_, rows_path_ == path_ ? files::Link::follow_once : files::Link::refuse);
  }
  // The benchmark has all of its rows: they replace an earlier FILE, and FILE.partial goes.
  void finish() {
    if (path_.empty() || rows_path_ == path_ || text_.empty()) return;
    write(path_, files::Link::follow_once);
    std::error_code ec;
    std::filesystem::remove(rows_path_, ec);
  }
  // The file could not be written (a full disk, a file-size limit): the rows that follow could
  // not be either, so the benchmark stops there rather than going on as if one row had failed.
  bool unwritable() const { return unwritable_; }

 private:
  void write(const std::string& path, files::Link link) {
    try {
      files::write_stamped(path, text_, "--json", link);
    } catch (const Error&) {
      unwritable_ = true;
      throw;
    }
  }
  std::string path_, rows_path_, text_;
  bool unwritable_ = false;
  files::Fd hold_;  // an flock on an earlier FILE while this benchmark's rows go to FILE.partial
};

std::string device_label(Device device) {
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) {
    auto d = cuda::devices();
    return d.empty() ? "cuda" : d[0].name;
  }
#endif
  (void)device;
  return "cpu";
}

std::string g_fp32_flash = "tf32x3";  // --fp32-flash
std::string g_bf16_gemm = "copies";   // --bf16-gemm
std::string g_head_projections = "in-place";  // --head-projections

std::string g_flash_backward;     // --flash-backward, where given

std::string flash_backward_in_use() {
#ifdef CAST_WITH_CUDA
  return cuda::flash_backward_name(cuda::flash_backward());
#else
  return "split";
#endif
}

std::string precision_note() {
  const std::string backward =
      (g_flash_backward.empty() ? "" : fmt::format(", flash backward {}", g_flash_backward)) +
      (g_head_projections == "in-place" ? "" : fmt::format(", head projections {}", g_head_projections));
  if (current_precision() != Precision::fp32)
    return fmt::format(", precision {}{}{}", precision_name(current_precision()),
                       g_bf16_gemm == "copies" ? "" : fmt::format(" with cuBLAS {}", g_bf16_gemm), backward);
  return (g_fp32_flash == "tf32x3" ? "" : fmt::format(", precision fp32 with flash kernel {}", g_fp32_flash)) + backward;
}

struct LayerTimes {
  int64_t n = 0;                      // the length N
  std::vector<double> forward, both;  // ms of each timed forward, and of each forward and backward
  double peak_mib = 0;                // of a forward and backward, above what was allocated before
};

// One attention layer on (B, N, D) normal inputs: `warmup` untimed forward and backward passes,
// `repeats` timed forwards, then `repeats` timed forward and backward passes; with a trace, one
// more warm pass traced under `label`.
LayerTimes time_layer(const nn::AttentionConfig& c, int64_t B, int64_t N, Device device, int64_t warmup,
                      int64_t repeats, train::Trace* trace, const std::string& label) {
  nn::Attention layer(c, DType::f32, device);
  Tensor x = Tensor::normal({B, N, c.dim}, 2, 0, 1.0, DType::f32, device).set_requires_grad();
  Tensor dout = Tensor::normal({B, N, c.dim}, 3, 0, 1.0, DType::f32, device);
  auto forward = [&] {
    autograd::NoGradGuard no_grad;
    layer.forward(x, Tensor());
  };
  auto both = [&] {
    Tensor out = layer.forward(x, Tensor()).out;
    autograd::backward(out, dout);
    x.reset_grad();
    for (auto& [name, p] : layer.parameters()) p.reset_grad();
  };
  for (int64_t i = 0; i < warmup; ++i) both();
  LayerTimes r;
  r.n = N;
  for (int64_t i = 0; i < repeats; ++i) r.forward.push_back(time_once(device, forward));
  train::reset_peak_memory(device);
  const size_t base = train::peak_memory(device);
  for (int64_t i = 0; i < repeats; ++i) r.both.push_back(time_once(device, both));
  const size_t peak = train::peak_memory(device);
  r.peak_mib = static_cast<double>(peak - std::min(base, peak)) / (1 << 20);
  if (trace) {  // one more, warm, pass: where its time goes
    trace->begin_pass(label, device);
    both();
    trace->end_pass();
  }
  return r;
}

void report_attention_row(const Variant& v, const nn::AttentionConfig& c, const LayerTimes& r, double estimate,
                          int64_t B, Device device, JsonLines& json_out) {
  const std::vector<double>&tf = r.forward, &tb = r.both;
  const double peak_mib = r.peak_mib;
  const int64_t D = c.dim, H = c.heads, N = r.n;
  fmt::print("{:<12} {:>6} {:>12.3f} {:>16.3f} {:>12.1f} {:>14.1f}{}\n", v.name, N, median(tf), median(tb), peak_mib,
             estimate / (1 << 20), trust_note(tb));
  json_out.add({{"mechanism", v.name},
                {"precision", precision_name(current_precision())},
                {"fp32_flash", g_fp32_flash},
                {"bf16_gemm", g_bf16_gemm},
                {"head_projections", g_head_projections},
                {"flash_backward", flash_backward_in_use()},
                {"n", N},
                {"batch", B},
                {"dim", D},
                {"heads", H},
                {"clusters", c.clusters},
                {"cluster_size", c.cluster_size},
                {"forward_ms", median(tf)},
                {"forward_backward_ms", median(tb)},
                {"peak_mib", peak_mib},
                {"device", device_label(device)},
                {"implementations", nn::step_implementations(c, device)}});
}

int bench_attention(const cli::Args& args, train::Trace* trace) {
  const Device device = train::resolve_device(args.str("device"));
  train::use_precision(args.str("precision"), device);
  const int64_t B = bounded(args, "batch", 1, 4096), D = bounded(args, "dim", 1, 65536),
                H = bounded(args, "heads", 1, 1024);
  if (D % H != 0) throw UsageError(fmt::format("--dim {} must be a multiple of --heads {}", D, H));
  const int64_t warmup = bounded(args, "warmup", 0, 100000), repeats = bounded(args, "repeats", 1, 100000);
  bool failed = false;
  std::string lens = args.str("lengths");
  if (lens.empty()) lens = device == Device::cuda ? "1024,2048,4096,8192,16384" : "256,512,1024";
  const std::vector<Variant> mechanisms = variants(args.str("mechanisms"));  // usage errors before any output
  std::vector<nn::Mechanism> read_by;
  for (const Variant& v : mechanisms) read_by.push_back(v.config.mechanism);
  cli::check_options_of_mechanisms(args, read_by, "--mechanisms");  // --clusters with full attention alone
  const std::vector<int64_t> ns = lengths("lengths", lens);
  // 0: the defaults, C = κ = ⌈√N⌉ rounded up to 8, so the work grows as N^1.5; fixed C and κ
  // (the CAST paper's O(αN) setting) make it linear in N
  nn::AttentionConfig sizes;
  cli::read_attention_options(args, {cli::AttentionOption::clusters, cli::AttentionOption::cluster_size}, sizes);
  const int64_t clusters = sizes.clusters, cluster_size = sizes.cluster_size;
  JsonLines json_out(args.str("json"), args.is_set("overwrite"));
  auto layer_config = [&](const Variant& v, int64_t N) {
    nn::AttentionConfig c = v.config;
    c.dim = D;
    c.heads = H;
    c.clusters = clusters > 0 ? clusters : nn::default_clusters(N);
    c.cluster_size = cluster_size;
    c.seed = 1;
    c.fused = !args.is_set("reference");
    return c;
  };
  for (const Variant& v : mechanisms)  // every row must fit before the first is timed
    for (int64_t N : ns) {
      CAST_CHECK_USAGE(v.config.mechanism == nn::Mechanism::full || clusters <= N,
                       "--clusters {} is more than the {} tokens of --lengths {}", clusters, N, N);
      const nn::Mechanism m = v.config.mechanism;
      train::require_memory(train::attention_layer_bytes(layer_config(v, N), B, N, D, device == Device::cuda), device,
                            fmt::format("{} attention at N {} (batch {}, D {})", v.name, N, B, D),
                            fmt::format("the attention layer takes all of it: lower --lengths or --batch{}",
                                        m == nn::Mechanism::full   ? ""
                                        : m == nn::Mechanism::cast ? ", or --clusters or --cluster-size"
                                                                   : ", or --clusters"));
    }
  fmt::print("attention benchmark on {}: B {}, D {}, {} heads, median of {} runs after {} warm-up{}\n",
             device_label(device), B, D, H, repeats, warmup, precision_note());
  for (const Variant& v : mechanisms)
    for (int64_t N : ns) {
      cli::note_cluster_size_against(layer_config(v, N), N, fmt::format("--lengths {}", N));
      cli::note_default_clusters_against(v.config.mechanism, clusters, N, fmt::format("--lengths {}", N));
    }
  fmt::print("{:<12} {:>6} {:>12} {:>16} {:>12} {:>14}\n", "mechanism", "N", "forward ms", "fwd+bwd ms", "peak MiB",
             "estimate MiB");
  for (const Variant& v : mechanisms) {
    for (int64_t N : ns) {
      const nn::AttentionConfig c = layer_config(v, N);
      const double estimate = train::attention_layer_bytes(c, B, N, D, device == Device::cuda);
      try {
        const LayerTimes r = time_layer(c, B, N, device, warmup, repeats, trace, fmt::format("{} N {}", v.name, N));
        report_attention_row(v, c, r, estimate, B, device, json_out);
      } catch (const Error& e) {
        autograd::clear_tape();
        if (trace) trace->abort_pass();
        if (json_out.unwritable()) throw;
        fmt::print("{:<12} {:>6} failed: {}\n", v.name, N, e.what());  // the table's row, and the error's line
        fmt::print(stderr, "cast bench: error: {} at N {}: {}\n", v.name, N, e.what());
        failed = true;
      }
      std::fflush(stdout);
    }
  }
  // which implementation each step ran (ops/attention/fast_paths.h's registry; --reference: the step ops)
  for (const Variant& v : mechanisms)
    fmt::print("{:<12} runs {}\n", v.name,
               fmt::join(nn::step_implementations(layer_config(v, ns.front()), device), ", "));
  json_out.finish();
  return failed ? 1 : 0;  // a failed row is a failed benchmark
}

// The preset's model with the variant's attention at length N, one sequence per example.
nn::ModelConfig bench_model(const train::TrainConfig& base, const Variant& v, int64_t N, bool reference) {
  nn::ModelConfig m = base.model;
  m.max_len = N;
  m.attention = v.config;
  m.attention.fused = !reference;
  m.dual = false;  // the benchmark feeds one sequence per example
  return m;
}

// B full-length sequences of token ids and their labels.
nn::Batch bench_batch(const nn::ModelConfig& m, int64_t B, int64_t N, Device device) {
  std::vector<int32_t> tok(B * N), labels(B);
  for (int64_t i = 0; i < B * N; ++i) tok[i] = 1 + static_cast<int32_t>(i * 7919 % (m.vocab - 1));
  for (int64_t b = 0; b < B; ++b) labels[b] = static_cast<int32_t>(b % m.classes);
  nn::Batch batch;
  batch.tokens = Tensor::from_vector<int32_t>(tok, {B, N}, device);
  batch.mask = Tensor::full({B, N}, 1.0, DType::f32, device);
  batch.labels = Tensor::from_vector<int32_t>(labels, {B}, device);
  batch.host_labels = labels;
  batch.real_tokens = B * N;
  return batch;
}

struct StepTimes {
  std::vector<double> times;  // ms of each timed step
  double peak_mib = 0;        // above what was allocated before the timed steps
  TransferCounts per_step;
};

// The trainer's own step (clipping, AdamW, statistics read back on log steps only), `warmup`
// times untimed, then `steps` times timed; with a trace, one more warm step traced.
StepTimes time_training_steps(nn::Transformer& model, const nn::Batch& batch, const train::TrainConfig& base,
                              Device device, int64_t warmup, int64_t steps, train::Trace* trace, const Variant& v) {
  nn::ParamList params = model.parameters();
  std::vector<Tensor> mo, ve;
  for (auto& [name, t] : params) {
    mo.push_back(Tensor::zeros(t->shape(), t->dtype(), device));
    ve.push_back(Tensor::zeros(t->shape(), t->dtype(), device));
  }
  const int64_t log_every = std::max<int64_t>(base.log_every, 1);
  train::TrainingStep training(model, params, mo, ve, log_every);
  int64_t t = 0;
  auto step = [&] {
    training.compute(batch, ++t);
    training.update(train::AdamWStep{1e-4, 0.9, 0.98, 1e-9, 0.0, t}, base.weight_decay, base.clip);
    if (t % log_every == 0) training.read();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  train::reset_peak_memory(device);
  const size_t base_bytes = train::peak_memory(device);
  const TransferCounts before = transfer_counts(device);
  StepTimes r;
  for (int64_t i = 0; i < steps; ++i) r.times.push_back(time_once(device, step));
  r.per_step = (transfer_counts(device) - before) / static_cast<double>(steps);
  const size_t peak = train::peak_memory(device);
  r.peak_mib = static_cast<double>(peak - std::min(base_bytes, peak)) / (1 << 20);
  if (trace) {  // one more, warm, step: where its time goes
    trace->begin_pass(fmt::format("{} step", v.name), device);
    step();
    trace->end_pass();
  }
  return r;
}

void report_training_step(const Variant& v, const StepTimes& r, double estimate, const train::TrainConfig& base,
                          int64_t N, int64_t B, Device device, JsonLines& json_out) {
  const double ms = median(r.times);
  fmt::print("{:<12} {:>10.2f} {:>10.3f} {:>12.1f} {:>14.1f}{}\n", v.name, ms, 1000.0 / ms, r.peak_mib,
             estimate / (1 << 20), trust_note(r.times));
  if (device == Device::cuda)
    fmt::print(
        "{:<12} per step: {:.1f} device-to-host copies, {:.1f} host-to-device copies, {:.1f} "
        "synchronisations, {:.1f} cudaMalloc calls\n",
        "", r.per_step.to_host, r.per_step.to_device, r.per_step.synchronizations, r.per_step.mallocs);
  json_out.add({{"mechanism", v.name},
                {"precision", precision_name(current_precision())},
                {"fp32_flash", g_fp32_flash},
                {"bf16_gemm", g_bf16_gemm},
                {"head_projections", g_head_projections},
                {"flash_backward", flash_backward_in_use()},
                {"recompute", base.model.recompute},
                {"task", base.task},
                {"n", N},
                {"batch", B},
                {"ms_per_step", ms},
                {"peak_mib", r.peak_mib},
                {"device", device_label(device)},
                {"to_host_per_step", r.per_step.to_host},
                {"to_device_per_step", r.per_step.to_device},
                {"synchronizations_per_step", r.per_step.synchronizations},
                {"mallocs_per_step", r.per_step.mallocs}});
}

int bench_train(const cli::Args& args, train::Trace* trace) {
  const Device device = train::resolve_device(args.str("device"));
  train::use_precision(args.str("precision"), device);
  const int64_t steps = bounded(args, "repeats", 1, 100000), warmup = bounded(args, "warmup", 0, 100000);
  train::TrainConfig base = train::preset(args.str("task"));
  base.model.recompute = args.is_set("recompute");
  const int64_t N = args.is_set("length") ? bounded(args, "length", 1, int64_t{1} << 20) : base.model.max_len;
  const int64_t B = args.is_set("batch-size") ? bounded(args, "batch-size", 1, 4096) : base.batch;
  const bool reference = args.is_set("reference");
  const std::vector<Variant> mechanisms = variants(args.str("mechanisms"));
  std::vector<double> estimates;  // every variant must fit before the first is timed
  for (const Variant& v : mechanisms) {
    train::check_clusters_fit(bench_model(base, v, N, reference), N);
    estimates.push_back(train::training_step_bytes(bench_model(base, v, N, reference), B, N, device == Device::cuda));
    train::require_memory(estimates.back(), device,
                          fmt::format("a {} training step of batch {} at length {}", v.name, B, N),
                          "lower --batch-size or --length");
  }
  JsonLines json_out(args.str("json"), args.is_set("overwrite"));
  fmt::print(
      "training-step benchmark on {}: task {} preset, length {}, batch {}, median of {} steps after {} warm-up{}\n",
      device_label(device), base.task, N, B, steps, warmup,
      precision_note() + (base.model.recompute ? ", each block run again in the backward (--recompute)" : ""));
  fmt::print("{:<12} {:>10} {:>10} {:>12} {:>14}\n", "mechanism", "ms/step", "steps/s", "peak MiB", "estimate MiB");
  bool failed = false;
  for (size_t vi = 0; vi < mechanisms.size(); ++vi) {
    const Variant& v = mechanisms[vi];
    try {
      const nn::ModelConfig m = bench_model(base, v, N, reference);
      nn::Transformer model(m, DType::f32, device);
      const StepTimes r =
          time_training_steps(model, bench_batch(m, B, N, device), base, device, warmup, steps, trace, v);
      report_training_step(v, r, estimates[vi], base, N, B, device, json_out);
    } catch (const Error& e) {
      autograd::clear_tape();
      if (trace) trace->abort_pass();
      if (json_out.unwritable()) throw;
      fmt::print("{:<12} failed: {}\n", v.name, e.what());  // the table's row, and the error's line
      fmt::print(stderr, "cast bench: error: {}: {}\n", v.name, e.what());
      failed = true;
    }
    std::fflush(stdout);
  }
  json_out.finish();
  return failed ? 1 : 0;
}

// The host memory bandwidth the memory-bound steps are compared with: acc += g over 64 Mi
// floats each (256 MiB, far past the caches), on every thread: two arrays read, one written.
void bench_bandwidth(int64_t repeats, int64_t warmup, JsonLines& json_out) {
  const int64_t n = int64_t{1} << 26;
  Tensor acc = Tensor::zeros({n}), g = Tensor::zeros({n});
  auto run = [&] { ops::add_into(acc, g); };
  for (int64_t i = 0; i < warmup; ++i) run();
  std::vector<double> times;
  for (int64_t i = 0; i < repeats; ++i) times.push_back(time_once(Device::cpu, run));
  const double gbps = 3.0 * 4 * n / median(times) / 1e6;
  fmt::print("memory bandwidth ({} threads), acc += g over 256 MiB arrays: {:.1f} GB/s{}\n", omp_get_max_threads(),
             gbps, trust_note(times));
  json_out.add({{"bandwidth_gbps", gbps}, {"threads", omp_get_max_threads()}});
}

// The tile products of the fused CPU kernels (flash attention's, at head width 64), on one
// thread as the kernels run them: the tile kernel against the BLAS on the same operands.
void bench_tiles(int64_t repeats, int64_t warmup, JsonLines& json_out) {
  struct Tile {
    const char* what;
    int64_t m, n, k;
    bool ta, tb;
  };
  const Tile tiles[] = {{"S = Q Kt", 64, 128, 64, false, true},
                        {"O += P V", 64, 64, 128, false, false},
                        {"dK += dSt Q", 128, 64, 64, true, false}};
  fmt::print("tile products on one thread (per core), median of {} batches of 64 after {} warm-up\n", repeats, warmup);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // the BLAS then runs on this thread, as inside the kernels' parallel regions
  for (const Tile& t : tiles) {
    Tensor a = Tensor::normal({t.m * t.k}, 1, 0, 1.0), b = Tensor::normal({t.k * t.n}, 2, 0, 1.0);
    Tensor c = Tensor::zeros({t.m * t.n});
    std::string line = fmt::format("  {:<12} {}x{}x{}:", t.what, t.m, t.n, t.k);
    for (ops::TileGemm which : {ops::TileGemm::kernel, ops::TileGemm::blas}) {
      const ops::TileGemm saved = ops::tile_gemm();
      ops::set_tile_gemm(which);
      auto run = [&] {
        for (int i = 0; i < 64; ++i)
          ops::gemm_tile<float>(c.data<float>(), a.data<float>(), b.data<float>(), t.ta, t.tb, 1.0f, 1.0f, t.m, t.n,
                                t.k);
      };
      for (int64_t i = 0; i < warmup; ++i) run();
      std::vector<double> times;
      for (int64_t i = 0; i < repeats; ++i) times.push_back(time_once(Device::cpu, run));
      ops::set_tile_gemm(saved);
      const double gflops = 64 * 2.0 * t.m * t.n * t.k / median(times) / 1e6;
      const char* name = which == ops::TileGemm::kernel ? "kernel" : "blas";
      line += fmt::format("  {} {:.1f} GFLOP/s{}", name, gflops, trust_note(times));
      json_out.add({{"tile", t.what}, {"m", t.m}, {"n", t.n}, {"k", t.k}, {"kernel", name}, {"gflops", gflops}});
    }
    fmt::print("{}\n", line);
  }
  omp_set_num_threads(threads);
}

// The machine's sgemm rate through the BLAS under matmul: the peak the attention kernels'
// GFLOP/s are compared with; then the tile products the fused kernels are made of.
int bench_gemm(const cli::Args& args) {
  const int64_t repeats = bounded(args, "repeats", 1, 100000), warmup = bounded(args, "warmup", 0, 100000);
  JsonLines json_out(args.str("json"), args.is_set("overwrite"));
  fmt::print("sgemm on the CPU BLAS ({} threads), median of {} after {} warm-up\n", omp_get_max_threads(), repeats,
             warmup);
  for (int64_t n : {512, 2048}) {
    Tensor a = Tensor::normal({n, n}, 1, 0, 1.0), b = Tensor::normal({n, n}, 2, 0, 1.0), c = Tensor::empty({n, n});
    auto run = [&] { ops::gemm(c, a, b, false, false, 1.0, 0.0, ops::GemmShape{1, n, n, n}); };
    for (int64_t i = 0; i < warmup; ++i) run();
    std::vector<double> times;
    for (int64_t i = 0; i < repeats; ++i) times.push_back(time_once(Device::cpu, run));
    const double ms = median(times);
    fmt::print("  {}x{}x{}: {:.2f} ms, {:.1f} GFLOP/s{}\n", n, n, n, ms, 2.0 * n * n * n / ms / 1e6, trust_note(times));
    json_out.add({{"gemm", n}, {"ms", ms}, {"gflops", 2.0 * n * n * n / ms / 1e6}, {"threads", omp_get_max_threads()}});
  }
  bench_bandwidth(repeats, warmup, json_out);
  bench_tiles(repeats, warmup, json_out);
  json_out.finish();
  return 0;
}

// `cast bench flash`: the flash kernels of cuda/attention/full_attention_flash.h, each kind of product (fma,
// tf32x3, tf32, bf16) at each length and head width: forward and backward time and TFLOPS, and
// each kernel's error against the CPU's f64 flash attention (one head of --check-length rows at each width,
// a quarter of the keys padding).
#ifdef CAST_WITH_CUDA
// ‖x − ref‖ / ‖ref‖ over all elements, x from the GPU, ref f64 on the CPU.
double relative_error(const Tensor& x, const Tensor& ref) {
  const Tensor a = x.to(Device::cpu).to(DType::f64);
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double e = a.data<double>()[i] - ref.data<double>()[i];
    num += e * e;
    den += ref.data<double>()[i] * ref.data<double>()[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

void flash_errors(const std::vector<cuda::FlashKernel>& kernels, int64_t N, int64_t d, JsonLines& json_out) {
  const Shape shape{1, 1, N, d};
  const Tensor q = Tensor::normal(shape, 7, 0), k = Tensor::normal(shape, 7, 1), v = Tensor::normal(shape, 7, 2),
               dout = Tensor::normal(shape, 7, 3);
  std::vector<float> real(N, 1.f);
  for (int64_t j = N - N / 4; j < N; ++j) real[j] = 0.f;
  const Tensor mask = Tensor::from_vector(real, {1, N});
  // the reference: the CPU's flash attention in f64 on the same (f32) values
  const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64), g64 = dout.to(DType::f64),
               m64 = mask.to(DType::f64);
  Tensor o64 = Tensor::empty(shape, DType::f64), l64 = Tensor::empty({1, 1, N}, DType::f64);
  ops::flash_attention_forward(o64, l64, q64, k64, v64, m64);
  Tensor dq64 = Tensor::zeros(shape, DType::f64), dk64 = Tensor::zeros(shape, DType::f64),
         dv64 = Tensor::zeros(shape, DType::f64);
  ops::flash_attention_backward(&dq64, &dk64, &dv64, g64, q64, k64, v64, m64, o64, l64);
  const Tensor qc = q.to(Device::cuda), kc = k.to(Device::cuda), vc = v.to(Device::cuda), gc = dout.to(Device::cuda),
               mc = mask.to(Device::cuda);
  fmt::print("error against f64 (N {}, d {}, a quarter of the keys padding): |x - ref| / |ref|\n", N, d);
  fmt::print("{:<8} {:>10} {:>10} {:>10} {:>10}\n", "kernel", "out", "dq", "dk", "dv");
  for (cuda::FlashKernel kernel : kernels) {
    // where another kernel takes these operands (tf32x3 beyond width 64: fma), its own row measures it
    if (cuda::flash_kernel_that_runs(kernel, qc, kc, vc, gc) != kernel) continue;
    Tensor out = Tensor::empty(shape, DType::f32, Device::cuda),
           lse = Tensor::empty({1, 1, N}, DType::f32, Device::cuda);
    cuda::flash_attention_forward(out, lse, qc, kc, vc, mc, kernel);
    Tensor dq = Tensor::zeros(shape, DType::f32, Device::cuda), dk = Tensor::zeros(shape, DType::f32, Device::cuda),
           dv = Tensor::zeros(shape, DType::f32, Device::cuda);
    cuda::flash_attention_backward(&dq, &dk, &dv, gc, qc, kc, vc, mc, out, lse, kernel);
    const double e[4] = {relative_error(out, o64), relative_error(dq, dq64), relative_error(dk, dk64),
                         relative_error(dv, dv64)};
    fmt::print("{:<8} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e}\n", cuda::flash_kernel_name(kernel), e[0], e[1], e[2],
               e[3]);
    json_out.add({{"kernel", cuda::flash_kernel_name(kernel)},
                  {"n", N},
                  {"head_width", d},
                  {"error_out", e[0]},
                  {"error_dq", e[1]},
                  {"error_dk", e[2]},
                  {"error_dv", e[3]}});
  }
}
#endif

#ifdef CAST_WITH_CUDA
// One (1, H, N, d) problem of `cast bench flash`: its inputs, outputs and gradients on the GPU.
struct FlashTensors {
  int64_t H, N, d;
  Tensor q, k, v, g, out, lse, dq, dk, dv;
  FlashTensors(int64_t heads, int64_t n, int64_t width) : H(heads), N(n), d(width) {
    const Shape shape{1, H, N, d};
    q = Tensor::normal(shape, 1, 0, 1.0, DType::f32, Device::cuda);
    k = Tensor::normal(shape, 1, 1, 1.0, DType::f32, Device::cuda);
    v = Tensor::normal(shape, 1, 2, 1.0, DType::f32, Device::cuda);
    g = Tensor::normal(shape, 1, 3, 1.0, DType::f32, Device::cuda);
    out = Tensor::empty(shape, DType::f32, Device::cuda);
    lse = Tensor::empty({1, H, N}, DType::f32, Device::cuda);
    dq = Tensor::zeros(shape, DType::f32, Device::cuda);
    dk = Tensor::zeros(shape, DType::f32, Device::cuda);
    dv = Tensor::zeros(shape, DType::f32, Device::cuda);
  }
};

// One row of the table: the kernel's forward and backward, median times and rates.
void time_flash_kernel(FlashTensors& x, cuda::FlashKernel kernel, int64_t warmup, int64_t repeats,
                       JsonLines& json_out) {
  const int d = static_cast<int>(x.d);
  // rows per warp x streamed rows, of the forward / of the backward
  const std::string tiles =
      kernel == cuda::FlashKernel::fma
          ? "-"
          : fmt::format("{}x{}/{}x{}{}", cuda::flash_warp_rows(kernel, d), cuda::flash_stream_rows(kernel, d, true),
                        cuda::flash_backward_warp_rows(kernel, d), cuda::flash_stream_rows(kernel, d, false),
                        !cuda::flash_backward_runs_fused(kernel, d)                  ? ""
                        : cuda::flash_backward() == cuda::FlashBackward::fused_atomic ? "a"
                                                                                       : "f") +
          (cuda::flash_copy_stages(kernel, d, false) == 1 ? " s1" : "");
  std::vector<double> tf, tb;
  for (int64_t r = 0; r < warmup + repeats; ++r) {
    const double f =
        time_once(Device::cuda, [&] { cuda::flash_attention_forward(x.out, x.lse, x.q, x.k, x.v, Tensor(), kernel); });
    const double b = time_once(Device::cuda, [&] {
      cuda::flash_attention_backward(&x.dq, &x.dk, &x.dv, x.g, x.q, x.k, x.v, Tensor(), x.out, x.lse, kernel);
    });
    if (r >= warmup) tf.push_back(f), tb.push_back(b);
  }
  const double f = median(tf), b = median(tb), flops = double(x.H) * x.N * x.N * x.d;
  fmt::print("{:<8} {:>6} {:>4} {:>6} {:>11} {:>11.3f} {:>11.1f} {:>11.3f} {:>11.1f}{}\n",
             cuda::flash_kernel_name(kernel), x.N, x.d, x.H, tiles, f, 4 * flops / f / 1e9, b, 10 * flops / b / 1e9,
             trust_note(tb));
  json_out.add({{"kernel", cuda::flash_kernel_name(kernel)},
                {"n", x.N},
                {"head_width", x.d},
                {"heads", x.H},
                {"tiles", tiles},
                {"backward", kernel == cuda::FlashKernel::fma          ? "fma"
                             : cuda::flash_backward_runs_fused(kernel, d) ? cuda::flash_backward_name(cuda::flash_backward())
                                                                          : "split"},
                {"forward_ms", f},
                {"backward_ms", b},
                {"forward_tflops", 4 * flops / f / 1e9},
                {"backward_tflops", 10 * flops / b / 1e9}});
}
#endif

int bench_flash(const cli::Args& args) {
  const Device device = train::resolve_device(args.str("device"));
  CAST_CHECK_USAGE(device == Device::cuda, "cast bench flash times the GPU's flash kernels: it needs --device cuda");
#ifdef CAST_WITH_CUDA
  std::vector<cuda::FlashKernel> kernels;
  std::stringstream names(args.str("kernels"));
  for (std::string name; std::getline(names, name, ',');) kernels.push_back(cuda::parse_flash_kernel(name));
  const std::vector<int64_t> ns = lengths("lengths", args.str("lengths").empty() ? "1024,4096,16384" : args.str("lengths"));
  const std::vector<int64_t> widths = lengths("head-widths", args.str("head-widths"));
  for (int64_t d : widths) CAST_CHECK_USAGE(d >= 1 && d <= 128, "--head-widths: {} is outside [1, 128]", d);
  const int64_t tokens = bounded(args, "tokens", 1, int64_t{1} << 26);
  const int64_t warmup = bounded(args, "warmup", 0, 100000), repeats = bounded(args, "repeats", 1, 100000);
  JsonLines json_out(args.str("json"), args.is_set("overwrite"));
  const int64_t check = bounded(args, "check-length", 0, 1 << 16);
  // every list read before the error check and the table: a bad value stops the command before its work
  const std::vector<int64_t> all_rows = cli::comma_integers("stream-rows", args.str("stream-rows"), 0, 128);
  const std::vector<int64_t> all_warp_rows = cli::comma_integers("warp-rows", args.str("warp-rows"), 0, 32);
  const std::vector<int64_t> all_stages = cli::comma_integers("copy-stages", args.str("copy-stages"), 0, 2);
  std::vector<cuda::FlashBackward> backwards;
  std::stringstream backward_names(args.str("flash-backward").empty() ? cuda::flash_backward_name(cuda::flash_backward())
                                                                      : args.str("flash-backward"));
  for (std::string name; std::getline(backward_names, name, ',');) backwards.push_back(cuda::parse_flash_backward(name));
  const cuda::FlashBackward engine_backward = cuda::flash_backward();
  if (check > 0)
    for (int64_t d : widths) flash_errors(kernels, check, d, json_out);
  fmt::print(
      "flash kernels on {}: batch 1, heads = max(1, {} / N), median of {} after {} warm-up; TFLOPS counts "
      "4 N^2 d per head forward, 10 N^2 d backward (FlashAttention-2's count)\n",
      device_label(device), tokens, repeats, warmup);
  fmt::print("{:<8} {:>6} {:>4} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "kernel", "N", "d", "heads", "tiles",
             "fwd ms", "fwd TFLOPS", "bwd ms", "bwd TFLOPS");
  for (int64_t N : ns)
    for (int64_t d : widths) {
      const int64_t H = std::max<int64_t>(1, tokens / N);
      FlashTensors x(H, N, d);
      for (int64_t stages : all_stages)
      for (int64_t warp_rows : all_warp_rows)
        for (int64_t rows : all_rows)
          for (cuda::FlashKernel kernel : kernels) {
            const bool first = rows == all_rows.front() && warp_rows == all_warp_rows.front() &&
                               stages == all_stages.front();
            if (kernel == cuda::FlashKernel::fma && !first) continue;  // no tensor-core tiles
            // the buffers are the split kernel's choice alone: the others run their one tile once
            if (kernel != cuda::FlashKernel::tf32x3 && stages != all_stages.front()) continue;
            // where another kernel takes the operands (tf32x3 beyond width 64: fma), its own row times it
            if (const cuda::FlashKernel runs = cuda::flash_kernel_that_runs(kernel, x.q, x.k, x.v, x.g);
                runs != kernel) {
              if (first)
                fmt::print("{:<8} {:>6} {:>4}: runs {} (its tiles need what this GPU or width lacks)\n",
                           cuda::flash_kernel_name(kernel), N, d, cuda::flash_kernel_name(runs));
              continue;
            }
            cuda::set_flash_stream_rows(static_cast<int>(rows));
            cuda::set_flash_warp_rows(static_cast<int>(warp_rows));
            cuda::set_flash_copy_stages(static_cast<int>(stages));
            for (cuda::FlashBackward backward : backwards) {
              if (kernel == cuda::FlashKernel::fma && backward != backwards.front()) continue;  // one backward
              cuda::set_flash_backward(backward);
              time_flash_kernel(x, kernel, warmup, repeats, json_out);
            }
            cuda::set_flash_backward(engine_backward);
          }
      cuda::set_flash_stream_rows(0);
      cuda::set_flash_warp_rows(0);
      cuda::set_flash_copy_stages(0);
    }
  json_out.finish();
  return 0;
#else
  (void)args;
  return 1;
#endif
}

cli::Args bench_args() {
  cli::Args args("bench",
                 "Benchmark attention layers (`cast bench attention`), training steps (`cast bench train`), the GPU's "
                 "flash kernels (`cast bench flash`), or the CPU's sgemm rate, memory bandwidth and tile products "
                 "(`cast bench gemm`).");
  args.option("what", "attention", "attention | train | flash | gemm")
      .option("device", "auto", "auto | cpu | cuda")
      .option("mechanisms", "full,cast-topk,cast-satopk,clustered,iclustered", "comma-separated list")
      .option("lengths", "", "attention: sequence lengths (default GPU 1024..16384, CPU 256,512,1024)")
      .option("batch", "1", "attention: batch size")
      .option("dim", "256", "attention: model dim (LRA Text: 256)")
      .option("heads", "4", "attention: heads (LRA Text: 4)");
  cli::add_attention_options(args, {cli::AttentionOption::clusters, cli::AttentionOption::cluster_size}, "attention: ");
  args.option("kernels", "fma,tf32x3,tf32,bf16",
              "flash: the kinds of product to time (cuda/attention/full_attention_flash.h)")
      .option("head-widths", "64", "flash: head widths, up to 128")
      .option("tokens", "65536", "flash: heads = tokens / N at each length N (batch 1)")
      .option("check-length", "1024", "flash: rows of the error check against f64 (0: none)")
      .option("stream-rows", "0",
              "flash: the tensor-core kernels' streamed tile rows, a list of 32, 64, 128 (0: the defaults); the "
              "table's tiles column shows what ran: rows per warp x streamed rows, of the forward / of the "
              "backward")
      .option("warp-rows", "0", "flash: rows per warp of the forward and the backward, a list of 16, 32 (0: the defaults)")
      .option("copy-stages", "0",
              "flash: the split TF32 kernel's buffers of streamed tiles in its backward at width 64, a list of 1, "
              "2 (0: the defaults; the tiles column ends in s1 where one ran)")
      .option("flash-backward", "",
              "flash, train, attention: the tensor-core backward, split (a dQ kernel and a dK/dV kernel) | fused "
              "(one kernel, dQ added in turn) | fused-atomic (one kernel, dQ added by atomic adds, not bit-identical "
              "from run to run); flash takes a list (default: the engine's; the tiles column ends in f where fused "
              "ran, a where fused-atomic ran)")
      .option("task", "text", "train: task preset")
      .option("length", "", "train: sequence length (default: the preset's)")
      .option("batch-size", "", "train: batch size (default: the preset's)")
      .option("warmup", "3", "untimed runs first")
      .option("repeats", "20", "timed runs (the median is reported)")
      .option("json", "", "also write the results as JSON lines to this file")
      .flag("overwrite", "replace an existing --json or --trace file that cast bench did not write")
      .flag("reference", "time the step-by-step reference attention ops instead of the fast paths (CPU and GPU)")
      .flag("recompute", "train: each block keeps only its input and runs again in the backward (cast train --recompute)")
      .option("precision", "fp32",
              "products on the GPU: fp32 | tf32 | bf16 (tensor/precision.h; the CPU runs fp32 only)")
      .option("fp32-flash", "tf32x3",
              "train, attention: the GPU's flash kernel at --precision fp32: tf32x3 (split TF32 on the tensor "
              "cores, the engine's choice) | fma (the FP32 units), to time one against the other")
      .option("bf16-gemm", "copies",
              "train, attention: the GPU's matmuls at --precision bf16: copies (BF16 copies of the operands, "
              "the engine's choice) | fast16bf (the FP32 operands with cuBLAS's FAST_16BF compute type), to time "
              "one against the other")
      .option("head-projections", "in-place",
              "train, attention: how the GPU lays out the heads: in-place (one strided product per head, the "
              "engine's choice) | permuted (one product of all heads and a permute, as the CPU), to time one "
              "against the other")
      .option("tile-gemm", "kernel",
              "the fused CPU kernels' tile products: kernel (register-blocked, cpu/gemm_tile.cpp) | blas")
      .optional_value("trace", "FILE",
                      "after timing each row, trace one more (warm) forward+backward: every node, then where "
                      "the time went by step (with FILE: JSON lines there instead)")
      .usage("cast bench attention|train|flash|gemm [options]")
      .example("cast bench attention --lengths 1024,4096 --mechanisms full,cast-topk")
      .example("cast bench attention --lengths 16384 --mechanisms cast-topk,clustered --reference")
      .example("cast bench attention --lengths 1024,4096,16384 --mechanisms cast-topk --clusters 64 --cluster-size 64")
      .example("cast bench train --task listops-short --mechanisms full,cast-topk")
      .example("cast bench train --task text --length 1024 --batch-size 4")
      .example("cast bench attention --lengths 4096 --mechanisms cast-topk --repeats 3 --trace")
      .example("cast bench flash --lengths 1024,4096,16384 --head-widths 32,64,128")
      .example("cast bench train --task text --precision bf16")
      .example("cast bench train --task text --length 1024 --batch-size 4 --recompute")
      .example("cast bench gemm");
  return args;
}

}  // namespace

int command_bench(const std::vector<std::string>& argv) {
  cli::Args args = bench_args();
  std::vector<std::string> rest = argv;
  if (!rest.empty() && rest[0].rfind("--", 0) != 0) rest.insert(rest.begin(), "--what");  // `cast bench train`
  if (!args.parse(rest)) return 0;
  const std::string what = args.choice("what", {"attention", "train", "flash", "gemm"});
  // an option of another benchmark would be ignored without a word (`bench gemm --lengths 64`)
  const std::map<std::string, std::set<std::string>> reads = {
      {"attention",
       {"lengths", "batch", "dim", "heads", "clusters", "cluster-size", "mechanisms", "fp32-flash", "bf16-gemm",
        "head-projections", "flash-backward"}},
      {"train",
       {"task", "length", "batch-size", "mechanisms", "fp32-flash", "bf16-gemm", "head-projections", "recompute",
        "flash-backward"}},
      {"flash",
       {"lengths", "kernels", "head-widths", "tokens", "check-length", "stream-rows", "warp-rows", "copy-stages",
        "flash-backward"}},
      {"gemm", {}}};
  for (const auto& [other, options] : reads)
    for (const std::string& option : options)
      CAST_CHECK_USAGE(!args.is_set(option) || reads.at(what).count(option),
                       "--{} is an option of cast bench {}, not of cast bench {}", option, other, what);
  // the gemm benchmark measures the CPU's BLAS alone: a --device cuda ran there without a word
  CAST_CHECK_USAGE(what != "gemm" || !args.is_set("device") || args.str("device") != "cuda",
                   "--device cuda: cast bench gemm measures the CPU's BLAS (cast bench flash measures the GPU's "
                   "kernels)");
  ops::set_tile_gemm(args.choice("tile-gemm", {"kernel", "blas"}) == "blas" ? ops::TileGemm::blas
                                                                            : ops::TileGemm::kernel);
  if (args.is_set("fp32-flash")) {
    const std::string kernel = args.choice("fp32-flash", {"fma", "tf32x3"});
    CAST_CHECK_USAGE(args.str("precision") == "fp32" && args.str("device") == "cuda",
                     "--fp32-flash {} chooses the GPU's kernel at --precision fp32: give --device cuda and no other "
                     "--precision",
                     kernel);
#ifdef CAST_WITH_CUDA
    cuda::set_fp32_flash_kernel(cuda::parse_flash_kernel(kernel));
#endif
    g_fp32_flash = kernel;
  }
  if (args.is_set("bf16-gemm")) {
    const std::string way = args.choice("bf16-gemm", {"copies", "fast16bf"});
    CAST_CHECK_USAGE(args.str("precision") == "bf16" && args.str("device") == "cuda",
                     "--bf16-gemm {} chooses how the GPU's matmuls take their operands at --precision bf16: give "
                     "--device cuda --precision bf16",
                     way);
    set_bf16_gemm(way == "copies" ? Bf16Gemm::bf16_operands : Bf16Gemm::fast16bf);
    g_bf16_gemm = way;
  }
  if (args.is_set("head-projections")) {
    const std::string way = args.choice("head-projections", {"in-place", "permuted"});
    CAST_CHECK_USAGE(args.str("device") == "cuda",
                     "--head-projections {} chooses how the GPU lays out the heads: give --device cuda", way);
    ops::set_cuda_head_projections(way == "in-place" ? ops::HeadProjections::in_place
                                                     : ops::HeadProjections::permuted);
    g_head_projections = way;
  }
  if (args.is_set("flash-backward") && what != "flash") {
    const std::string backward = args.choice("flash-backward", {"split", "fused", "fused-atomic"});
    CAST_CHECK_USAGE(args.str("device") == "cuda", "--flash-backward {} chooses the GPU's backward: give --device cuda",
                     backward);
#ifdef CAST_WITH_CUDA
    cuda::set_flash_backward(cuda::parse_flash_backward(backward));
#endif
    g_flash_backward = backward;
  }
  std::optional<train::Trace> trace;
  if (args.is_set("trace")) {
    CAST_CHECK_USAGE(what != "gemm" && what != "flash", "--trace traces attention layers and training steps, not {}",
                     what);
    const std::string& file = args.str("trace");
    CAST_CHECK_USAGE(file.empty() || args.str("json").empty() || !files::same_path(file, args.str("json")),
                     "--trace and --json name the same file {}", file);
    CAST_CHECK_USAGE(file != "attention" && file != "train" && file != "gemm",
                     "--trace {0}: name the benchmark first (cast bench {0} --trace)", file);
    trace.emplace(args.str("trace"), true, args.is_set("overwrite"));
  }
  const int code = what == "attention" ? bench_attention(args, trace ? &*trace : nullptr)
                   : what == "train"   ? bench_train(args, trace ? &*trace : nullptr)
                   : what == "flash"   ? bench_flash(args)
                                       : bench_gemm(args);
  if (trace) trace->write_file();
  return code;
}

}  // namespace cast
