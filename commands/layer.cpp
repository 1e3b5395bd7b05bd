#include "commands/commands.h"

#include <climits>
#include <optional>

#include "autograd/tape.h"
#include "nn/attention.h"
#include "train/memory_estimate.h"
#include "ops/ops.h"
#include "tensor/files.h"
#include "tensor/safetensors.h"
#include "commands/cli.h"
#include "train/trainer.h"
#include "train/trace.h"

namespace cast {

namespace {

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
      .option("attention", "full", "full | cast | clustered | iclustered")
      .option("heads", "1", "number of heads H")
      .option("clusters", "0", "clusters C (0: ceil(sqrt(N)) rounded up to a multiple of 8)")
      .option("cluster-size", "0", "CAST cluster size K (0: the same default)")
      .option("clustering", "topk", "CAST clustering: topk | satopk")
      .option("f", "softmax", "CAST attention function: softmax | laplace")
      .option("summaries", "on", "CAST cluster summaries: on | off")
      .option("mix", "affinity", "CAST mixing weights: affinity | query")
      .option("cast-heads", "per-head", "CAST clustering: per-head | shared")
      .option("topk", "32", "improved clustered: keys per cluster")
      .option("bits", "63", "clustered: LSH hash bits")
      .option("iterations", "10", "clustered: Lloyd iterations")
      .option("seed", "0", "seed of the LSH planes and k-means draws")
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
Tensor load_float(const TensorFile& f, const std::string& name, const Shape& shape, DType dtype, Device device) {
  const Tensor& t = f.get(name);
  CAST_CHECK(is_float(t.dtype()), "{}: tensor '{}' must be F32 or F64, got {}", f.source, name, dtype_name(t.dtype()));
  CAST_CHECK(t.shape() == shape, "{}: tensor '{}' must have shape {}, got {}", f.source, name, shape_str(shape),
             shape_str(t.shape()));
  return t.to(dtype).to(device);
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
  const int64_t heads = bounded("heads", 1, 1024), clusters = bounded("clusters", 0, 1 << 16);
  const int64_t cluster_size = bounded("cluster-size", 0, 1 << 20), topk = bounded("topk", 1, 1 << 22);
  const int64_t bits = bounded("bits", 1, 63), iterations = bounded("iterations", 0, 100000);
  const int64_t seed = bounded("seed", 0, INT64_MAX);
  CAST_CHECK_USAGE(!args.str("in").empty() && !args.str("out").empty(),
                   "--in and --out are required (see cast layer --help)");
  // the output never replaces the input, and a bad output path is refused before the work
  files::check_not_an_input(args.str("out"), "--out", {args.str("in")});
  files::check_replaces_own_kind(args.str("out"), "--out", "a safetensors file other than a checkpoint",
                                 looks_like_plain_safetensors);
  const std::string trace_file = args.str("trace");
  if (!trace_file.empty()) {
    files::check_not_an_input(trace_file, "--trace", {args.str("in")});
    CAST_CHECK_USAGE(!files::same_path(trace_file, args.str("out")), "--trace {} is also --out: name two files",
                     trace_file);
  }
  std::optional<train::Trace> trace;  // installed before the layer runs; checks its file first
  if (args.is_set("trace")) trace.emplace(trace_file);
  const DType dtype = args.choice("dtype", {"f32", "f64"}) == "f64" ? DType::f64 : DType::f32;
  const Device device = args.choice("device", {"cpu", "cuda"}) == "cuda" ? Device::cuda : Device::cpu;
  CAST_CHECK_USAGE(!(dtype == DType::f64 && device == Device::cuda), "--dtype f64 runs on the CPU only");
  train::use_precision(args.str("precision"), device);

  const TensorFile file = read_safetensors(args.str("in"), "--in");
  const Tensor& x_raw = file.get("x");
  CAST_CHECK(x_raw.ndim() == 3, "{}: tensor 'x' must be (B, N, D), got shape {}", file.source,
             shape_str(x_raw.shape()));
  const int64_t B = x_raw.dim(0), N = x_raw.dim(1), D = x_raw.dim(2);

  nn::AttentionConfig config;
  config.mechanism = nn::parse_mechanism(args.choice("attention", {"full", "cast", "clustered", "iclustered"}));
  config.dim = D;
  config.heads = heads;
  CAST_CHECK(D % config.heads == 0, "--heads {} must divide the model dim D = {}", config.heads, D);
  config.clusters = clusters;
  config.cluster_size = cluster_size;
  if (config.mechanism == nn::Mechanism::cast && config.clusters <= 0) config.clusters = nn::default_clusters(N);
  config.single_assignment = args.choice("clustering", {"topk", "satopk"}) == "satopk";
  config.f =
      args.choice("f", {"softmax", "laplace"}) == "laplace" ? ops::AttentionFn::laplace : ops::AttentionFn::softmax;
  config.summaries = args.choice("summaries", {"on", "off"}) == "on";
  config.fused = !args.is_set("reference");
  ops::set_cpu_gemm(args.is_set("reference") ? ops::CpuGemm::loops : ops::CpuGemm::blas);
  config.mix_query = args.choice("mix", {"affinity", "query"}) == "query";
  config.shared_clustering = args.choice("cast-heads", {"per-head", "shared"}) == "shared";
  config.topk = topk;
  config.bits = bits;
  config.iterations = iterations;
  config.seed = static_cast<uint64_t>(seed);

  train::require_memory(
      train::attention_layer_bytes(config, B, N, D, device == Device::cuda) * (dtype == DType::f64 ? 2 : 1), device,
      fmt::format("{}: one {} attention layer on (B {}, N {}, D {})", file.source, nn::mechanism_name(config.mechanism),
                  B, N, D),
      "a smaller input, or fewer --clusters");
  nn::Attention layer(config, dtype, device);
  const int64_t H = config.heads, d = D / H, C = config.clusters;
  std::map<std::string, Shape> weight_shapes = {{"wq", {D, D}}, {"wk", {D, D}}, {"wv", {D, D}}, {"wo", {D, D}}};
  if (config.mechanism == nn::Mechanism::cast) {
    const bool shared = config.shared_clustering;
    weight_shapes["surrogates"] = shared ? Shape{C, D} : Shape{H, C, d};
    weight_shapes["gate_w"] = shared ? Shape{D, 1} : Shape{D, H};
    weight_shapes["gate_b"] = shared ? Shape{1} : Shape{H};
  }
  for (const auto& [name, shape] : weight_shapes)
    layer.parameters()[name] = load_float(file, name, shape, dtype, device).set_requires_grad();

  Tensor x = load_float(file, "x", {B, N, D}, dtype, device).set_requires_grad();
  Tensor dout = load_float(file, "dout", {B, N, D}, dtype, device);
  Tensor mask = file.has("mask") ? load_float(file, "mask", {B, N}, dtype, device) : Tensor();
  Tensor assignment;
  if (file.has("assignment")) {
    CAST_CHECK(config.mechanism == nn::Mechanism::clustered || config.mechanism == nn::Mechanism::iclustered,
               "{}: tensor 'assignment' is only used by --attention clustered|iclustered", file.source);
    assignment = file.get("assignment", DType::i32, {B, H, N}).to(device);
  }

  if (trace) trace->begin_pass("layer", device);
  nn::AttentionOutput result = layer.forward(x, mask, assignment);
  autograd::backward(result.out, dout);
  if (trace) trace->end_pass();

  std::map<std::string, Tensor> out = {{"out", result.out}, {"grad.x", x.grad()}};
  for (auto& [name, p] : layer.parameters())
    out["grad." + name] = p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), dtype, device);
  if (result.clusters.defined()) out["clusters"] = result.clusters;
  if (result.assignment.defined()) out["assignment"] = result.assignment;
  write_safetensors(args.str("out"), out, {{"attention", nn::mechanism_name(config.mechanism)}}, "--out");
  if (trace) trace->write_file();
  fmt::print("cast layer: {} B={} N={} D={} H={}{} -> {}\n", nn::mechanism_name(config.mechanism), B, N, D, H,
             config.mechanism == nn::Mechanism::cast ? fmt::format(" C={}", C) : std::string(), args.str("out"));
  return 0;
}

}  // namespace cast
