// `--trace`: what it shows of the tape, checked against the tape itself and against memory.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/ops.h"
#include "tests/devices.h"
#include "tests/test_util.h"
#include "train/cli.h"
#include "train/trace.h"

namespace {

using namespace cast;
using cast::testing::devices_here;
using nlohmann::json;
namespace fs = std::filesystem;

nn::AttentionConfig layer_config(nn::Mechanism mechanism, bool fast) {
  nn::AttentionConfig c;
  c.mechanism = mechanism;
  c.dim = 16;
  c.heads = 2;
  c.clusters = 4;
  c.cluster_size = 6;
  c.topk = 5;
  c.seed = 3;
  c.fused = fast;
  return c;
}

struct Layer {
  nn::Attention attention;
  Tensor x, mask, dout;
  Layer(const nn::AttentionConfig& c, Device device, int64_t B = 2, int64_t N = 20)
      : attention(c, DType::f32, device),
        x(Tensor::normal({B, N, c.dim}, 5, 0, 1.0, DType::f32, device).set_requires_grad()),
        mask(cast::testing::tail_mask(N, {0, 3}, DType::f32).to(device)),
        dout(Tensor::normal({B, N, c.dim}, 6, 0, 1.0, DType::f32, device)) {}
  Tensor forward() { return attention.forward(x, mask).out; }
};

// One traced forward and backward of the layer; the events in order.
std::vector<json> trace_layer(Layer& layer, Device device) {
  train::Trace trace("", /*print=*/false);
  trace.begin_pass("layer", device);
  autograd::backward(layer.forward(), layer.dout);
  trace.end_pass();
  return trace.events();
}

std::vector<std::string> step_sequence(const std::vector<json>& events) {
  std::vector<std::string> steps;
  for (const json& e : events)
    if (e["phase"] == "step" && e["event"] == "begin") steps.push_back(e["step"]);
  return steps;
}

TEST(Trace, OneCastLayerListsItsStepsInOrder) {
  for (Device device : devices_here()) {
    for (bool fast : {false, true}) {
      Layer layer(layer_config(nn::Mechanism::cast, fast), device);
      const std::vector<json> events = trace_layer(layer, device);
      // docs/attention.md's steps 1–7, with steps 1 and 2 (one step op) once for the queries and once for the keys;
      // where one op runs them (cast_attention_fused on the CPU, cast_attention_recompute on the GPU), the whole of
      // them is its one step, after the gate (step 3's first half, recorded before the projections)
      const bool one_op = nn::fast_path_steps(layer.attention.config(), device).back() == ops::Step::cast_attention;
      EXPECT_EQ(one_op, fast);
      const std::vector<std::string> want =
          one_op ? std::vector<std::string>{"gated_affinity", "cast_attention"}
                 : std::vector<std::string>{"cluster_affinities", "cluster_affinities",      "gated_affinity",
                                            "cluster_topk",       "intra_cluster_attention", "cluster_summaries",
                                            "combine_clusters"};
      EXPECT_EQ(step_sequence(events), want) << device_name(device) << (fast ? " fast" : " reference");
      // Step 4 records no node (its indices are constants); every other step records some.
      std::map<std::string, int> nodes;
      for (const json& e : events)
        if (e["phase"] == "forward" && !e["step"].is_null()) ++nodes[e["step"]];
      for (const std::string& step : want) EXPECT_EQ(nodes[step] > 0, step != "cluster_topk") << step;
      // Every node of the forward has its backward line, in reverse order.
      std::vector<int64_t> forward, backward;
      for (const json& e : events) {
        if (e["phase"] == "forward") forward.push_back(e["index"]);
        if (e["phase"] == "backward") backward.push_back(e["index"]);
      }
      std::reverse(backward.begin(), backward.end());
      EXPECT_EQ(forward, backward);
      EXPECT_EQ(events.back()["phase"], "totals");
      EXPECT_EQ(events.back()["nodes"], static_cast<int64_t>(forward.size()));
    }
  }
}

TEST(Trace, ReferenceNamesOnlyReferenceOps) {
  for (Device device : devices_here()) {
    for (nn::Mechanism m :
         {nn::Mechanism::full, nn::Mechanism::cast, nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
      SCOPED_TRACE(fmt::format("{} on {}", nn::mechanism_name(m), device_name(device)));
      Layer reference(layer_config(m, false), device);
      int64_t nodes = 0;
      for (const json& e : trace_layer(reference, device)) {
        if (e["phase"] != "forward") continue;
        ++nodes;
        EXPECT_TRUE(e["fast_path"].is_null()) << e.dump();
        EXPECT_EQ(e["implementation"], fmt::format("reference {}", device_name(device))) << e.dump();
      }
      EXPECT_GT(nodes, 0);
      // The same layer with its fast paths names each one that the registry chose (so the check
      // above can fail): every mechanism has a fast path on the CPU and the GPU for f32.
      Layer fast(layer_config(m, true), device);
      std::set<std::string> fast_paths;
      for (const json& e : trace_layer(fast, device))
        if (e["phase"] == "forward" && !e["fast_path"].is_null()) fast_paths.insert(e["fast_path"]);
      std::set<std::string> chosen;
      for (const std::string& implementation : nn::step_implementations(fast.attention.config(), device))
        if (implementation.find("(reference)") == std::string::npos) chosen.insert(implementation);
      EXPECT_FALSE(chosen.empty());
      EXPECT_EQ(fast_paths, chosen);
    }
  }
}

// A pass that throws is dropped; the trace records nothing until the next pass begins.
TEST(Trace, AnAbortedPassLeavesTheTraceOff) {
  Layer layer(layer_config(nn::Mechanism::cast, true), Device::cpu);
  train::Trace trace("", false);
  trace.begin_pass("fails", Device::cpu);
  layer.forward();
  EXPECT_THROW(ops::matmul(layer.x, layer.x), Error);  // (B, N, D) · (B, N, D): inner dims differ
  autograd::clear_tape();
  trace.abort_pass();
  EXPECT_TRUE(trace.events().empty());
  layer.forward();  // outside a pass: not traced
  autograd::clear_tape();
  EXPECT_TRUE(trace.events().empty());
  trace.begin_pass("works", Device::cpu);
  autograd::backward(layer.forward(), layer.dout);
  EXPECT_GT(trace.end_pass().nodes, 0);
  for (const json& e : trace.events()) EXPECT_EQ(e["pass"], "works");
}

// Every storage the tape holds, each once, counted by walking the tape.
struct TapeBytes final : autograd::FieldVisitor {
  std::set<const Storage*> seen;
  size_t bytes = 0;
  void add(const Tensor& t) {
    if (t.defined() && seen.insert(t.impl()->storage.get()).second) bytes += t.impl()->storage->bytes;
  }
  void input(const char*, const Tensor& t) override { add(t); }
  void saved(const char*, const Tensor& t) override { add(t); }
};

TEST(Trace, SavedBytesAreWhatTheTapeHolds) {
  for (Device device : devices_here()) {
    for (nn::Mechanism m :
         {nn::Mechanism::full, nn::Mechanism::cast, nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
      SCOPED_TRACE(fmt::format("{} on {}", nn::mechanism_name(m), device_name(device)));
      Layer layer(layer_config(m, true), device);
      train::Trace trace("", false);
      trace.begin_pass("layer", device);
      Tensor out = layer.forward();
      TapeBytes walked;
      autograd::for_each_node([&](const autograd::Node& node) {
        node.fields(walked);
        for (const Tensor& o : node.outputs) walked.add(o);
      });
      EXPECT_GT(walked.bytes, 0u);
      EXPECT_EQ(trace.totals().saved_bytes, walked.bytes);
      if (device == Device::cpu) EXPECT_LE(walked.bytes, host_memory_stats().current);  // all of it is alive
      autograd::backward(out, layer.dout);
      EXPECT_EQ(trace.end_pass().saved_bytes, walked.bytes);
    }
  }
}

// The bytes the step's nodes made stay below the peak `cast bench attention` measures for the
// same layer (its peak counts what the step allocates above what was live before it).
TEST(Trace, SavedBytesStayBelowTheBenchPeak) {
  const auto dir = fs::temp_directory_path() / ("cast_trace_bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string json_path = (dir / "bench.jsonl").string();
  const std::string cmd = std::string(CAST_BINARY) +
                          " bench attention --device cpu --mechanisms full,cast-topk,clustered,iclustered "
                          "--lengths 256 --batch 2 --dim 32 --heads 2 --warmup 0 --repeats 1 --json " +
                          json_path + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(json_path);
  int rows = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    const json row = json::parse(line);
    nn::AttentionConfig c;
    c.mechanism = nn::parse_mechanism(row["mechanism"] == "cast-topk" ? "cast" : row["mechanism"].get<std::string>());
    c.dim = 32;
    c.heads = 2;
    c.clusters = nn::default_clusters(256);
    c.seed = 1;
    nn::Attention layer(c, DType::f32, Device::cpu);
    Tensor x = Tensor::normal({2, 256, 32}, 2, 0, 1.0).set_requires_grad();
    train::Trace trace("", false);
    trace.begin_pass("layer", Device::cpu);
    autograd::backward(layer.forward(x, Tensor()).out, Tensor::normal({2, 256, 32}, 3, 0));
    const train::TraceTotals totals = trace.end_pass();
    const double made_mib = static_cast<double>(totals.saved_bytes - totals.saved_bytes_unmade) / (1 << 20);
    EXPECT_GT(made_mib, 0.0);
    EXPECT_LT(made_mib, row["peak_mib"].get<double>()) << row.dump();
  }
  EXPECT_EQ(rows, 4);
  fs::remove_all(dir);
}

}  // namespace

namespace {
// `--trace` alone, `--trace FILE` and `--trace=FILE`: an option whose value may be left out.
TEST(Trace, OptionTakesAnOptionalFile) {
  auto parse = [](std::vector<std::string> argv) {
    cli::Args args("x", "test");
    args.optional_value("trace", "FILE", "help").option("steps", "1", "help");
    args.parse(argv);
    return std::make_tuple(args.is_set("trace"), args.str("trace"), args.str("steps"));
  };
  EXPECT_EQ(parse({}), std::make_tuple(false, std::string(), std::string("1")));
  EXPECT_EQ(parse({"--trace"}), std::make_tuple(true, std::string(), std::string("1")));
  EXPECT_EQ(parse({"--trace", "--steps", "3"}), std::make_tuple(true, std::string(), std::string("3")));
  EXPECT_EQ(parse({"--trace", "t.jsonl", "--steps", "3"}),
            std::make_tuple(true, std::string("t.jsonl"), std::string("3")));
  EXPECT_EQ(parse({"--trace=--odd"}), std::make_tuple(true, std::string("--odd"), std::string("1")));
}
}  // namespace
