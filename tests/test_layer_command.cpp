// Layer 3: the audit command against reference files computed outside the engine
// (tests/reference/make_layer_reference.py: numpy forward from ATTENTION.md, gradients by
// central differences), and its errors on files that do not match the options.
#include <unistd.h>  // getpid: the plain and the emulated test process run side by side
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tensor/safetensors.h"
#include "tests/test_util.h"
#include "commands/commands.h"

using namespace cast;
using namespace cast::testing;

static std::string data_file(const std::string& name) { return std::string(CAST_TEST_DATA_DIR) + "/" + name; }
static std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("cast_layer_" + std::to_string(getpid()) + "_" + name)).string();
}

static void expect_matches_reference(const std::string& reference, std::vector<std::string> options) {
  const std::string out = temp_file(reference);
  options.insert(options.end(), {"--in", data_file(reference), "--out", out, "--dtype", "f64"});
  ASSERT_EQ(command_layer(options), 0);
  TensorFile ref = read_safetensors(data_file(reference)), got = read_safetensors(out);
  int compared = 0;
  for (const auto& [name, expected] : ref.tensors) {
    if (name.rfind("expected.", 0) != 0) continue;
    const std::string key = name.substr(9);
    ASSERT_TRUE(got.has(key)) << key;
    if (key == "clusters") {
      EXPECT_EQ(max_abs_diff(got.get(key), expected), 0.0) << key;
    } else {
      // the reference gradients are central differences: accurate to about 1e-8
      EXPECT_LT(rel_diff(got.get(key), expected), 1e-6) << key;
    }
    ++compared;
  }
  EXPECT_GE(compared, 6);
}

TEST(LayerCommand, FullAttentionMatchesIndependentReference) {
  expect_matches_reference("layer_full.safetensors", {"--attention", "full", "--heads", "2"});
  expect_matches_reference("layer_full.safetensors", {"--attention", "full", "--heads", "2", "--reference"});
}

struct ReferenceCase {
  std::string file;
  std::vector<std::string> options;
};

class LayerReference : public ::testing::TestWithParam<ReferenceCase> {};

// The fused kernels (the default) and the step-by-step reference ops (--reference) both match.
TEST_P(LayerReference, MatchesIndependentImplementation) {
  expect_matches_reference(GetParam().file, GetParam().options);
  std::vector<std::string> reference = GetParam().options;
  reference.push_back("--reference");
  expect_matches_reference(GetParam().file, reference);
}

static std::vector<std::string> cast_options(std::vector<std::string> extra) {
  std::vector<std::string> o = {"--attention", "cast", "--heads", "2", "--clusters", "3", "--cluster-size", "3"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Mechanisms, LayerReference,
    ::testing::Values(ReferenceCase{"layer_cast.safetensors", cast_options({"--clustering", "topk", "--f", "softmax"})},
                      ReferenceCase{"layer_cast_satopk_laplace.safetensors",
                                    cast_options({"--clustering", "satopk", "--f", "laplace"})},
                      ReferenceCase{"layer_cast_nosummaries_query.safetensors",
                                    cast_options({"--summaries", "off", "--mix", "query"})},
                      ReferenceCase{"layer_cast_shared.safetensors", cast_options({"--cast-heads", "shared"})},
                      ReferenceCase{"layer_cast_shared_satopk.safetensors",
                                    cast_options({"--cast-heads", "shared", "--clustering", "satopk", "--f", "laplace",
                                                  "--mix", "query"})},
                      ReferenceCase{"layer_clustered.safetensors",
                                    {"--attention", "clustered", "--heads", "2", "--clusters", "3"}},
                      ReferenceCase{"layer_iclustered.safetensors",
                                    {"--attention", "iclustered", "--heads", "2", "--clusters", "3", "--topk", "3"}}),
    [](const auto& info) {
      std::string n = info.param.file.substr(6, info.param.file.size() - 6 - 12);
      return n;
    });

TEST(LayerCommand, MismatchedFilesNameTheTensor) {
  const std::string in = temp_file("bad_in.safetensors"), out = temp_file("bad_out.safetensors");
  auto run = [&](std::map<std::string, Tensor> t, std::vector<std::string> opts) {
    write_safetensors(in, t);
    opts.insert(opts.end(), {"--in", in, "--out", out});
    command_layer(opts);
  };
  std::map<std::string, Tensor> good = {{"x", Tensor::zeros({1, 4, 4})}, {"dout", Tensor::zeros({1, 4, 4})},
                                        {"wq", Tensor::zeros({4, 4})},   {"wk", Tensor::zeros({4, 4})},
                                        {"wv", Tensor::zeros({4, 4})},   {"wo", Tensor::zeros({4, 4})}};
  auto without = [&](const std::string& name) {
    auto t = good;
    t.erase(name);
    return t;
  };
  auto with = [&](const std::string& name, Tensor v) {
    auto t = good;
    t[name] = v;
    return t;
  };
  EXPECT_CAST_ERROR(run(without("wk"), {}), "missing tensor 'wk'");
  EXPECT_CAST_ERROR(run(with("wv", Tensor::zeros({4, 3})), {}), "'wv' must have shape [4, 4]");
  EXPECT_CAST_ERROR(run(with("dout", Tensor::zeros({1, 4, 4}, DType::i32)), {}), "'dout' must be F32 or F64");
  EXPECT_CAST_ERROR(run(with("mask", Tensor::zeros({1, 5})), {}), "'mask' must have shape [1, 4]");
  EXPECT_CAST_ERROR(run(good, {"--attention", "cast", "--clusters", "2"}), "missing tensor 'gate_b'");
  EXPECT_CAST_ERROR(run(with("assignment", Tensor::zeros({1, 1, 4})), {"--attention", "clustered"}),
                    "'assignment' must be i32");
  EXPECT_CAST_ERROR(run(good, {"--heads", "3"}), "--heads 3 must divide");
  EXPECT_CAST_ERROR(run(good, {"--attention", "sparse"}), "--attention must be one of");
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(LayerCommand, EveryMechanismRunsAndWritesItsIndices) {
  const std::string in = temp_file("all_in.safetensors"), out = temp_file("all_out.safetensors");
  const int64_t B = 1, N = 9, D = 8, H = 2, C = 2;
  std::map<std::string, Tensor> t = {{"x", Tensor::normal({B, N, D}, 1, 0)}, {"dout", Tensor::normal({B, N, D}, 2, 0)}};
  for (const char* w : {"wq", "wk", "wv", "wo"}) t[w] = Tensor::normal({D, D}, 3, 0, 0.3);
  t["surrogates"] = Tensor::normal({H, C, D / H}, 4, 0);
  t["gate_w"] = Tensor::normal({D, H}, 5, 0);
  t["gate_b"] = Tensor::zeros({H});
  write_safetensors(in, t);
  // each mechanism with the options it reads (one it does not read is refused: test_cli_files)
  const std::map<std::string, std::vector<std::string>> options = {
      {"full", {}},
      {"cast", {"--clusters", "2", "--cluster-size", "5"}},
      {"clustered", {"--clusters", "2", "--bits", "8"}},
      {"iclustered", {"--clusters", "2", "--topk", "3", "--bits", "8"}}};
  for (std::string m : {"full", "cast", "clustered", "iclustered"}) {
    std::vector<std::string> args = {"--in", in, "--out", out, "--attention", m, "--heads", "2"};
    args.insert(args.end(), options.at(m).begin(), options.at(m).end());
    ASSERT_EQ(command_layer(args), 0);
    TensorFile f = read_safetensors(out);
    f.get("out", DType::f32, {B, N, D});
    f.get("grad.x", DType::f32, {B, N, D});
    f.get("grad.wo", DType::f32, {D, D});
    if (m == "cast") {
      f.get("clusters", DType::i32, {B, H, C, 5});
      f.get("grad.gate_w", DType::f32, {D, H});
    }
    if (m == "clustered" || m == "iclustered") f.get("assignment", DType::i32, {B, H, N});
  }
}

// --trace FILE: one JSON object per line, the forward nodes, the backward in reverse, the totals.
TEST(LayerCommand, TraceWritesJsonLines) {
  const std::string out = temp_file("trace_out.safetensors"), trace = temp_file("trace.jsonl");
  std::vector<std::string> options = cast_options({"--in", data_file("layer_cast.safetensors"), "--out", out});
  options.insert(options.end(), {"--trace", trace, "--reference"});  // the step ops: one step each
  ASSERT_EQ(command_layer(options), 0);
  std::ifstream in(trace);
  std::map<std::string, int> phases;
  std::vector<std::string> steps;
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) {
    last = nlohmann::json::parse(line);
    ++phases[last["phase"]];
    if (last["phase"] == "step" && last["event"] == "begin" &&
        (steps.empty() || steps.back() != last["step"].get<std::string>()))
      steps.push_back(last["step"]);
  }
  EXPECT_GT(phases["forward"], 10);
  EXPECT_EQ(phases["forward"], phases["backward"]);
  EXPECT_EQ(phases["totals"], 1);
  EXPECT_EQ(last["phase"], "totals");
  EXPECT_EQ(last["nodes"], phases["forward"]);
  EXPECT_GT(last["saved_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(steps.size(), 6u);  // steps 1–2 (twice in a row, queries then keys, counted once), then 3 to 7
  // The trace file is never an input or the output, however the output is spelled, and also
  // when the output does not exist yet.
  const std::string fresh = temp_file("trace_fresh.safetensors");
  const std::string fresh_spelled =
      (std::filesystem::path(fresh).parent_path() / "." / std::filesystem::path(fresh).filename()).string();
  std::vector<std::string> fresh_options = cast_options({"--in", data_file("layer_cast.safetensors"), "--out", fresh});
  fresh_options.insert(fresh_options.end(), {"--trace", fresh_spelled});
  EXPECT_THROW(command_layer(fresh_options), UsageError);
  EXPECT_FALSE(std::filesystem::exists(fresh));
  for (const std::string& clash : {data_file("layer_cast.safetensors"), out}) {
    std::vector<std::string> bad = cast_options({"--in", data_file("layer_cast.safetensors"), "--out", out});
    bad.insert(bad.end(), {"--trace", clash});
    EXPECT_THROW(command_layer(bad), UsageError) << clash;
  }
  std::filesystem::remove(out);
  std::filesystem::remove(trace);
}

// A finite input whose scores overflow f32 gives NaN: the output is written as it came, and a
// note says which tensors hold values that are not finite, and why (eighth attack, H21).
TEST(LayerCommand, ValuesTheFormatCannotHoldAreNoted) {
  TensorFile file = read_safetensors(data_file("layer_full.safetensors"));
  std::vector<double> x = file.get("x").to_double_vector();
  for (double& v : x) v *= 1e30;
  file.tensors["x"] = Tensor::from_vector<double>(x, file.get("x").shape());
  const std::string in = temp_file("huge_x.safetensors"), out = temp_file("huge_out.safetensors");
  write_safetensors(in, file.tensors);
  ::testing::internal::CaptureStdout();
  const int code = command_layer({"--in", in, "--out", out, "--heads", "2", "--overwrite"});
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  EXPECT_NE(printed.find("values are not finite (NaN or inf) in grad.wk (64)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("beyond what f32 products hold: scale the inputs down, or give --dtype f64"), std::string::npos)
      << printed;
  // in f64 the same input is held: no note
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(command_layer({"--in", in, "--out", out, "--heads", "2", "--overwrite", "--dtype", "f64"}), 0);
  const std::string f64 = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(f64.find("not finite"), std::string::npos) << f64;
  EXPECT_EQ(f64.find("may pass"), std::string::npos) << f64;
  // finite outputs from inputs whose products pass f32's range: a score at -inf gives zeros as
  // padding does, and a note says it may have happened (tenth attack, K7)
  for (double& v : x) v *= 1e-10;  // largest about 3e20: its square passes f32's range
  file.tensors["x"] = Tensor::from_vector<double>(x, file.get("x").shape());
  for (const char* w : {"wq", "wk", "wv", "wo"}) {  // weights small enough that nothing overflows here
    std::vector<double> values = file.get(w).to_double_vector();
    for (double& v : values) v *= 1e-25;
    file.tensors[w] = Tensor::from_vector<double>(values, file.get(w).shape());
  }
  write_safetensors(in, file.tensors);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(command_layer({"--in", in, "--out", out, "--heads", "2", "--overwrite"}), 0);
  const std::string risk = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(risk.find("a score that overflows to -inf masks its key as padding does"), std::string::npos) << risk;
}
