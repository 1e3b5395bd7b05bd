#include "commands/commands.h"

#include "commands/attention_options.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "autograd/tape.h"
#include "nn/attention.h"
#include "train/memory_estimate.h"
#include "ops/ops.h"
#include "tensor/files.h"
#include "train/run_folder.h"
#include "tensor/safetensors.h"
#include "train/cli.h"
#include "train/trainer.h"
#include "train/trace.h"

namespace cast {

namespace {

using cli::AttentionOption;
constexpr std::initializer_list<AttentionOption> kLayerAttentionOptions = {
    AttentionOption::clusters,  AttentionOption::cluster_size, AttentionOption::clustering, AttentionOption::f,
    AttentionOption::summaries, AttentionOption::mix,          AttentionOption::cast_heads, AttentionOption::topk,
    AttentionOption::bits,      AttentionOption::iterations};

cli::Args layer_args() {
  cli::Args a("layer",
              "Run one attention layer forward and backward on tensors from a safetensors file.\n"
              "input:  x (B,N,D); optional mask (B,N) 1 = real; dout (B,N,D); wq wk wv wo (D,D), q = x·wq;\n"
              "        CAST: surrogates (H,C,d) per-head or (C,D) shared, gate_w (D,H) or (D,1), gate_b (H) or (1);\n"
              "        clustered: optional assignment (B,H,N) int32, -1 = no cluster.\n"
              "output: out, grad.x, grad.<weight> for every weight; CAST clusters (B,H,C,K) int32;\n"
              "        clustered assignment (B,H,N) int32.");
  a.option("in", "", "input safetensors file (required)")
      .option("out", "", "output safetensors file (required)")
      .flag("overwrite", "replace an existing --out or --trace file that cast layer did not write")
      .option("attention", "full", "full | cast | clustered | iclustered")
      .option("heads", "1", "number of heads H");
  cli::add_attention_options(a, kLayerAttentionOptions);
  a.option("seed", "0", "seed of the LSH planes and k-means draws")
      .option("device", "cpu", "cpu | cuda")
      .option("dtype", "f32", "f32 | f64 (f64 on the CPU only)")
      .option("precision", "fp32", "products on the GPU: fp32 | tf32 | bf16 (the CPU runs fp32 only)")
      .optional_value("trace", "FILE",
                      "print the tape as it runs: each node's op, implementation, shapes, saved tensors and "
                      "time, then the totals (with FILE: JSON lines there instead)")
      .flag("reference",
            "the step-by-step reference ops instead of the fast paths (CPU and GPU; on the CPU also the plain-loop "
            "matmul)")
      .example("cast layer --in tests/data/layer_full.safetensors --out out.safetensors --attention full --heads 2")
      .example(
          "cast layer --in my_layer.safetensors --out out.safetensors --attention cast --heads 2 --clusters 3 "
          "--cluster-size 3 --dtype f64 --reference")
      .example(
          "cast layer --in tests/data/layer_cast.safetensors --out out.safetensors --attention cast --heads 2 "
          "--clusters 3 --cluster-size 3 --trace");
  return a;
}

// A float tensor from the file, checked for its shape, converted to the compute dtype and device.
// `why`: the settings the shape follows from, said where it differs ("" for x's width alone).
Tensor load_float(const TensorFile& f, const std::string& name, const Shape& shape, DType dtype, Device device,
                  const std::string& why = "") {
  const Tensor& t = f.get(name);
  CAST_CHECK(is_float(t.dtype()), "{}: tensor '{}' must be F32 or F64, got {}", f.source, name, dtype_name(t.dtype()));
  CAST_CHECK(t.shape() == shape, "{}: tensor '{}' must have shape {}, got {}{}", f.source, name, shape_str(shape),
             shape_str(t.shape()), why.empty() ? std::string() : fmt::format(" ({})", why));
  return t.to(dtype).to(device);
}

// The layer's weights from the file, each checked for its shape.
void load_weights(nn::Attention& layer, const TensorFile& file, const nn::AttentionConfig& config, DType dtype,
                  Device device) {
  const int64_t D = config.dim, H = config.heads, d = D / H, C = config.clusters;
  struct Expected {
    Shape shape;
    std::string why;
  };
  std::map<std::string, Expected> weights = {{"wq", {{D, D}, ""}}, {"wk", {{D, D}, ""}}, {"wv", {{D, D}, ""}},
                                             {"wo", {{D, D}, ""}}};
  if (config.mechanism == nn::Mechanism::cast) {
    // CAST's own weights follow the clustering's settings: the message names them
    const bool shared = config.shared_clustering;
    const std::string heads = shared ? "--cast-heads shared: one clustering for every head"
                                     : fmt::format("--cast-heads per-head: --heads {}", H);
    weights["surrogates"] = {shared ? Shape{C, D} : Shape{H, C, d},
                             fmt::format("--clusters {}; {}{}", C, heads, shared ? "" : fmt::format(" of width {}", d))};
    weights["gate_w"] = {shared ? Shape{D, 1} : Shape{D, H}, heads};
    weights["gate_b"] = {shared ? Shape{1} : Shape{H}, heads};
  }
  for (const auto& [name, expected] : weights)
    layer.parameters()[name] =
        load_float(file, name, expected.shape, dtype, device, expected.why).set_requires_grad();
}

// The first few of `names` for a note, "a, b, c, d, ...": a file may hold thousands.
std::string first_names(const std::vector<std::string>& names) {
  const size_t shown = std::min<size_t>(names.size(), 4);
  return fmt::format("{}{}", fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                     shown < names.size() ? ", ..." : "");
}

// F64 inputs computed in f32 lose their precision: said in a note, not silently.
void note_narrowed(const TensorFile& file, DType dtype) {
  if (dtype != DType::f32) return;
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors)
    if (t.dtype() == DType::f64 && !name.starts_with("expected.")) names.push_back(name);
  if (!names.empty())
    fmt::print("note: {} holds {} F64 tensor{} ({}), computed in f32 (--dtype f32); give --dtype f64 to keep {} "
               "precision\n",
               file.source, names.size(), names.size() == 1 ? "" : "s", first_names(names),
               names.size() == 1 ? "its" : "their");
}

// Values the format could not hold (a finite x near 1e30 overflows f32 in the scores) are
// written as they came, NaN or inf, and a note says which tensors hold them and why. Where every
// value is finite but products of the inputs' largest values pass f32's range, a score may still
// have overflowed to −inf, which masks its key as padding does (a row of them gives zeros): a
// note says so too.
void note_overflow(const std::map<std::string, Tensor>& out, const TensorFile& file, DType dtype, int64_t D) {
  std::vector<std::string> names;
  int64_t count = 0;
  for (const auto& [name, t] : out) {
    if (!is_float(t.dtype())) continue;
    int64_t here = 0;
    for (double v : t.to_double_vector()) here += std::isfinite(v) ? 0 : 1;
    if (here > 0) names.push_back(fmt::format("{} ({})", name, here));
    count += here;
  }
  double largest = 0;
  bool finite = true;
  for (const auto& [name, t] : file.tensors) {
    if (!is_floating(t.dtype()) || name.starts_with("expected.")) continue;
    for (double v : t.to_double_vector()) {
      finite = finite && std::isfinite(v);
      largest = std::max(largest, std::abs(v));
    }
  }
  const std::string remedy = dtype == DType::f32 ? ": scale the inputs down, or give --dtype f64" : ": scale the inputs down";
  if (count > 0) {
    const std::string why = finite ? fmt::format("the largest |value| among the inputs in {} is {:g}, beyond what {} "
                                                 "products hold{}",
                                                 file.source, largest, dtype_name(dtype), remedy)
                                   : fmt::format("the inputs in {} hold values that are not finite", file.source);
    fmt::print("note: {} value{} not finite (NaN or inf) in {}: {}\n", count, count == 1 ? " is" : "s are",
               fmt::join(names, ", "), why);
    return;
  }
  const double range = dtype == DType::f32 ? 3.4e38 : 1.7e308;
  if (finite && largest * largest * static_cast<double>(D) > range)
    fmt::print("note: the largest |value| among the inputs in {} is {:g}: {} products of such values may pass the "
               "format's range, and a score that overflows to -inf masks its key as padding does{}\n",
               file.source, largest, dtype_name(dtype), remedy);
}

// What cast layer writes in its output's metadata: the file a later --out may replace.
constexpr std::string_view kLayerOutputMark = "\"made_by\":\"cast layer\"";

// --in and --out given; the output never replaces the input, and a bad output path is refused
// before the work.
void check_files(const cli::Args& args) {
  CAST_CHECK_USAGE(!args.str("in").empty() && !args.str("out").empty(),
                   "--in and --out are required (see cast layer --help)");
  files::check_not_an_input(args.str("out"), "--out", {args.str("in")});
  train::check_user_output(args.str("out"), "--out", "an output of cast layer", kLayerOutputMark,
                           args.is_set("overwrite"));
}

// --trace's file, checked to be neither the input nor the output, opened (and checked that it can be
// written) before the layer runs.
void open_trace(const cli::Args& args, std::optional<train::Trace>& trace) {
  const std::string trace_file = args.str("trace");
  if (!trace_file.empty()) {
    files::check_not_an_input(trace_file, "--trace", {args.str("in")});
    CAST_CHECK_USAGE(!files::same_path(trace_file, args.str("out")), "--trace {} is also --out: name two files",
                     trace_file);
  }
  if (args.is_set("trace")) trace.emplace(trace_file, true, args.is_set("overwrite"));
}

// What the output file holds: the output, every gradient, and the clusters or assignment.
std::map<std::string, Tensor> outputs(nn::Attention& layer, const nn::AttentionOutput& result, const Tensor& x,
                                      DType dtype, Device device) {
  std::map<std::string, Tensor> out = {{"out", result.out}, {"grad.x", x.grad()}};
  for (auto& [name, p] : layer.parameters())
    out["grad." + name] = p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), dtype, device);
  if (result.clusters.defined()) out["clusters"] = result.clusters;
  if (result.assignment.defined()) out["assignment"] = result.assignment;
  return out;
}

// The input file's tensors besides the weights: x and dout (B, N, D), the mask (B, N) and the
// clustered mechanisms' assignment (B, H, N) where given.
struct LayerInputs {
  Tensor x, dout, mask, assignment;
};
LayerInputs load_inputs(const TensorFile& file, const nn::AttentionConfig& config, DType dtype, Device device) {
  // A misspelled optional tensor ('Mask') would be left out without a word: a name that is one
  // of the inputs but for its case is refused, and any other tensor the layer does not read
  // (a reference's expected outputs kept in the same file, say) is named in a note.
  static const std::set<std::string> known = {"x",  "dout", "mask",       "assignment", "wq",    "wk",
                                              "wv", "wo",   "surrogates", "gate_w",     "gate_b"};
  const auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::vector<std::string> unread;
  for (const auto& [name, t] : file.tensors) {
    const bool cast_only = name == "surrogates" || name == "gate_w" || name == "gate_b";
    if (cast_only && config.mechanism != nn::Mechanism::cast) {  // CAST's weights, under another mechanism
      unread.insert(unread.begin(), "'" + name + "' (read by --attention cast)");  // named first: the likely mistake
      continue;
    }
    if (known.count(name)) continue;
    CAST_CHECK(!known.count(lower(name)), "{}: tensor '{}' is not an input of cast layer; did you mean '{}'?",
               file.source, name, lower(name));
    unread.push_back("'" + name + "'");  // quoted: an empty name shows as ''
  }
  if (!unread.empty())
    fmt::print("note: {} holds {} tensor{} cast layer does not read: {}\n", file.source, unread.size(),
               unread.size() == 1 ? "" : "s", first_names(unread));
  const Tensor& x_raw = file.get("x");
  const int64_t B = x_raw.dim(0), N = x_raw.dim(1), D = x_raw.dim(2);
  CAST_CHECK(B > 0 && N > 0, "{}: tensor 'x' has shape {}: a layer needs at least one sequence of one token",
             file.source, shape_str(x_raw.shape()));
  LayerInputs in;
  in.x = load_float(file, "x", {B, N, D}, dtype, device).set_requires_grad();
  in.dout = load_float(file, "dout", {B, N, D}, dtype, device);
  if (file.has("mask")) {
    in.mask = load_float(file, "mask", {B, N}, dtype, device);
    for (double m : in.mask.to_double_vector())  // a weight of 0.5 is no token and no padding
      CAST_CHECK(m == 0.0 || m == 1.0, "{}: tensor 'mask' holds {}: a mask is 1 (a token) or 0 (padding)", file.source,
                 m);
  }
  // An assignment is refused where a CAST weight is only noted: the weights of one layer file
  // serve every mechanism (as a checkpoint's do when eval swaps it), but an assignment decides
  // the clusters, and a result computed without it would answer another question.
  if (file.has("assignment")) {
    CAST_CHECK_USAGE(config.mechanism == nn::Mechanism::clustered || config.mechanism == nn::Mechanism::iclustered,
               "{}: tensor 'assignment' is only used by --attention clustered|iclustered", file.source);
    const Tensor& assignment = file.get("assignment", DType::i32, {B, config.heads, N});
    for (const int32_t a :
         std::vector<int32_t>(assignment.data<int32_t>(), assignment.data<int32_t>() + assignment.numel()))
      CAST_CHECK(a >= -1 && a < (config.clusters > 0 ? config.clusters : N), "{}: tensor 'assignment' holds {}: {}",
                 file.source, a,
                 config.clusters > 0
                     ? fmt::format("ids are -1 (no cluster) or 0 to {} (--clusters {})", config.clusters - 1,
                                   config.clusters)
                     : fmt::format("ids are -1 (no cluster) or 0 to {} (its {} tokens fill at most {} clusters)", N - 1,
                                   N, N));
    // -1 is a padding token's: a real token given it attends to nothing, and its output and
    // gradients are zero, which a file of all -1 showed without a word (twentieth attack)
    const std::vector<double> mask = in.mask.defined() ? in.mask.to_double_vector() : std::vector<double>();
    const int64_t H = config.heads;
    int64_t unclustered = 0, real = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i) {
        if (!mask.empty() && mask[static_cast<size_t>(b * N + i)] == 0.0) continue;
        ++real;
        for (int64_t h = 0; h < H; ++h)
          if (assignment.data<int32_t>()[(b * H + h) * N + i] == -1) {
            ++unclustered;
            break;
          }
      }
    if (unclustered > 0)
      fmt::print("note: {}: tensor 'assignment' puts {} of the {} real tokens (mask 1{}) in no cluster (-1) in at "
                 "least one head: a token attends to nothing in such a head, and its output there is zero\n",
                 file.source, unclustered, real, mask.empty() ? ", as no mask is given" : "");
    in.assignment = assignment.to(device);
  }
  return in;
}

}  // namespace

int command_layer(const std::vector<std::string>& argv) {
  cli::Args args = layer_args();
  if (!args.parse(argv)) return 0;
  // Every number is checked before any file is read: each sizes an allocation or a loop.
  const auto bounded = [&](const char* name, int64_t lo, int64_t hi) {
    const int64_t v = args.integer(name);
    CAST_CHECK_USAGE(v >= lo && v <= hi, "--{} is {}: it must be in [{}, {}]", name, v, lo, hi);
    return v;
  };
  nn::AttentionConfig config;
  config.heads = bounded("heads", 1, 1024);
  cli::read_attention_options(args, kLayerAttentionOptions, config);
  config.seed = static_cast<uint64_t>(bounded("seed", 0, INT64_MAX));
  check_files(args);
  std::optional<train::Trace> trace;
  open_trace(args, trace);
  const DType dtype = args.choice("dtype", {"f32", "f64"}) == "f64" ? DType::f64 : DType::f32;
  const Device device = args.choice("device", {"cpu", "cuda"}) == "cuda" ? Device::cuda : Device::cpu;
  CAST_CHECK_USAGE(!(dtype == DType::f64 && device == Device::cuda), "--dtype f64 runs on the CPU only");
  train::use_precision(args.str("precision"), device);

  const TensorFile file = read_safetensors(args.str("in"), "--in");
  const Tensor& x_raw = file.get("x");
  CAST_CHECK(x_raw.ndim() == 3, "{}: tensor 'x' must be (B, N, D), got shape {}", file.source,
             shape_str(x_raw.shape()));
  const int64_t B = x_raw.dim(0), N = x_raw.dim(1), D = x_raw.dim(2);
  CAST_CHECK(D > 0, "{}: tensor 'x' has shape {}: a token needs a width D of at least one", file.source,
             shape_str(x_raw.shape()));

  config.mechanism = nn::parse_mechanism(args.choice("attention", {"full", "cast", "clustered", "iclustered"}));
  cli::check_options_of_mechanisms(args, {config.mechanism});
  CAST_CHECK_USAGE(!args.is_set("seed") || config.mechanism == nn::Mechanism::clustered ||
                       config.mechanism == nn::Mechanism::iclustered,
                   "--seed draws the LSH planes and k-means of --attention clustered and iclustered, not of {}",
                   nn::mechanism_name(config.mechanism));
  config.dim = D;
  // x's width and the weights' must agree before any flag is blamed for either
  if (file.tensors.count("wq")) {
    const Tensor& wq = file.get("wq");
    CAST_CHECK(wq.ndim() == 2 && wq.dim(0) == D && wq.dim(1) == D,
               "{}: tensor 'x' has width D = {} (shape {}), but 'wq' has shape {}, not [{}, {}]", file.source, D,
               shape_str(x_raw.shape()), shape_str(wq.shape()), D, D);
  }
  CAST_CHECK_USAGE(D % config.heads == 0, "--heads {} must divide the model dim D = {}", config.heads, D);
  const int64_t given_clusters = config.clusters;
  if (config.mechanism == nn::Mechanism::cast && config.clusters <= 0) config.clusters = nn::default_clusters(N);
  CAST_CHECK_USAGE(config.mechanism == nn::Mechanism::full || config.clusters <= N,
                   "--clusters {} is more than the {} tokens of x in {}", config.clusters, N, file.source);
  CAST_CHECK_USAGE(!args.is_set("topk") || config.topk <= N,
                   "--topk {} is more than the {} tokens of x in {}", config.topk, N, file.source);
  config.fused = !args.is_set("reference");
  ops::set_cpu_gemm(args.is_set("reference") ? ops::CpuGemm::loops : ops::CpuGemm::blas);

  train::require_memory(
      train::attention_layer_bytes(config, B, N, D, device == Device::cuda) * (dtype == DType::f64 ? 2 : 1), device,
      fmt::format("{}: one {} attention layer on (B {}, N {}, D {})", file.source, nn::mechanism_name(config.mechanism),
                  B, N, D),
      config.mechanism == nn::Mechanism::full ? "a smaller input (fewer tokens or rows)"
                                              : "a smaller input, or fewer --clusters");
  nn::Attention layer(config, dtype, device);
  load_weights(layer, file, config, dtype, device);
  const int64_t H = config.heads, C = config.clusters;

  LayerInputs in = load_inputs(file, config, dtype, device);
  if (trace) trace->begin_pass("layer", device);
  nn::AttentionOutput result = layer.forward(in.x, in.mask, in.assignment);
  autograd::backward(result.out, in.dout);
  if (trace) trace->end_pass();

  const std::map<std::string, Tensor> out = outputs(layer, result, in.x, dtype, device);
  write_safetensors(args.str("out"), out,
                    {{"attention", nn::mechanism_name(config.mechanism)},
                     {"made_by", "cast layer"},
                     {"digest", std::string(files::kDigestSlot)}},  // that nobody changed the file since
                    "--out");
  if (trace) trace->write_file();
  // notes after the work, which may still have been refused: an error stays one line
  note_narrowed(file, dtype);
  cli::note_cluster_size_against(config, N, fmt::format("x in {}", file.source));
  cli::note_default_clusters_against(config.mechanism, given_clusters, N, fmt::format("x in {}", file.source));
  note_overflow(out, file, dtype, D);
  fmt::print("cast layer: {} B={} N={} D={} H={}{} -> {}\n", nn::mechanism_name(config.mechanism), B, N, D, H,
             config.mechanism == nn::Mechanism::cast ? fmt::format(" C={}", C) : std::string(), args.str("out"));
  return 0;
}

}  // namespace cast
