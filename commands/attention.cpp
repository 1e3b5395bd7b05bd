// `cast attention`: a trained full-attention model's attention weights on one test input, for a
// few queries, against clustered and improved clustered attention with the same weights.
#include <algorithm>
#include <climits>
#include <cmath>

#include "autograd/tape.h"
#include "tensor/files.h"
#include "figures/attention_figure.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/run_folder.h"
#include "commands/commands.h"

#include "commands/attention_options.h"

namespace cast {

namespace {

// Every real query's weights of one head over every key, the CLS's included: [query][key].
std::vector<std::vector<double>> head_rows(const Tensor& weights, int64_t head, int offset) {
  const int64_t N = weights.dim(2);
  const auto w = weights.to_double_vector();  // (1, H, N, N)
  std::vector<std::vector<double>> rows(N - offset, std::vector<double>(N));
  for (int64_t q = offset; q < N; ++q)
    for (int64_t k = 0; k < N; ++k) rows[q - offset][k] = w[(head * N + q) * N + k];
  return rows;
}

// What the checkpoint holds, checked before its weights and data are read: a one-text
// full-attention model short enough to draw.
nn::ModelConfig drawable_model(const std::string& checkpoint, const train::TrainConfig& trained) {
  const nn::ModelConfig& m = trained.model;
  CAST_CHECK_USAGE(m.attention.mechanism == nn::Mechanism::full,
                   "{}: a {} model; cast attention compares a full-attention model's weights with the approximations "
                   "that reuse them",
                   checkpoint, nn::mechanism_name(m.attention.mechanism));
  CAST_CHECK_USAGE(!m.dual, "{}: a two-text model; cast attention draws one input", checkpoint);
  constexpr int64_t kLongest = 4096;  // (N, N) weights per head and mechanism: hundreds of MiB beyond
  CAST_CHECK_USAGE(m.tokens() <= kLongest, "{}: sequences of up to {} tokens; cast attention draws at most {}",
                   checkpoint, m.tokens(), kLongest);
  return m;
}

// The panel of the mechanism whose weights are every.back(): its name, its drawn rows (the
// CLS's weight is counted, not drawn) and the weight each query moved from full attention.
void add_panel(train::AttentionPanels& panels, const std::vector<std::vector<std::vector<double>>>& every,
               nn::Mechanism mechanism, int64_t C, int64_t top, int offset) {
  panels.mechanisms.push_back(mechanism == nn::Mechanism::full        ? std::string("full (trained)")
                              : mechanism == nn::Mechanism::clustered ? fmt::format("clustered, C {}", C)
                                                                      : fmt::format("improved, C {}, top {}", C, top));
  std::vector<std::vector<double>> chosen;
  for (int64_t q : panels.queries) chosen.emplace_back(every.back()[q].begin() + offset, every.back()[q].end());
  panels.rows.push_back(chosen);
  std::vector<double> moved;  // over every key, the CLS's included
  for (int64_t q : panels.queries) moved.push_back(train::total_variation(every.front()[q], every.back()[q]));
  panels.moved.push_back(moved);
}

// Each approximation's weight moved from full attention, the mean over every query.
void print_moved_weight(const train::AttentionPanels& panels,
                        const std::vector<std::vector<std::vector<double>>>& every, int64_t tokens) {
  for (size_t mi = 1; mi < every.size(); ++mi) {
    double sum = 0;
    for (int64_t q = 0; q < tokens; ++q) sum += train::total_variation(every[0][q], every[mi][q]);
    fmt::print("  {:<28} {:.3f}\n", panels.mechanisms[mi], sum / static_cast<double>(tokens));
  }
}

cli::Args attention_args() {
  cli::Args args("attention",
                 "Draw where a few queries of one test input put their attention weight in a trained full-attention "
                 "model, and where clustered and improved clustered attention with the same weights put it (the "
                 "clustered-attention paper's comparison): one row per query, one panel per mechanism, each key "
                 "shaded by its weight; prints how much weight each approximation moves, over every query.");
  args.option("checkpoint", "", "full-attention checkpoint (required)")
      .option("out", "attention.svg", "output SVG")
      .flag("overwrite", "replace an existing --out that is not a cast figure")
      .option("index", "0", "which test example")
      .option("layer", "1", "which layer (1 = first)")
      .option("head", "1", "which head (1 = first)")
      .option("queries", "", "token positions, comma-separated (default: four spread over the input)")
      .option("data", "", "data folder (default: the one the run used)");
  cli::add_attention_options(args, cli::kClusteredAttentionOptions);
  args.example("cast attention --checkpoint runs/fm-full/checkpoint.safetensors --clusters 8 --topk 8 --out att.svg");
  return args;
}

// Each mechanism's weights of one head (1-based), computed with the trained layer's weights and
// `approximation`'s clustering, and its panel: [mechanism][query][key], every query.
std::vector<std::vector<std::vector<double>>> mechanism_rows(train::AttentionPanels& panels, nn::Block& block,
                                                             const nn::AttentionConfig& approximation, int64_t head,
                                                             int offset) {
  const int64_t N = block.attention_input.dim(1), C = approximation.clusters;
  std::vector<std::vector<std::vector<double>>> every;
  for (nn::Mechanism mechanism : {nn::Mechanism::full, nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
    nn::AttentionConfig a = block.attention->config();
    a.mechanism = mechanism;
    a.clusters = C, a.topk = approximation.topk, a.bits = approximation.bits, a.iterations = approximation.iterations;
    nn::Attention attention(a);
    for (auto& [name, w] : attention.parameters()) w.copy_from(block.attention->parameters().at(name));
    every.push_back(head_rows(attention.weights(block.attention_input, block.attention_mask), head - 1, offset));
    add_panel(panels, every, mechanism, C, std::min(approximation.topk, N), offset);
  }
  return every;
}

}  // namespace

int command_attention(const std::vector<std::string>& argv) {
  cli::Args args = attention_args();
  if (!args.parse(argv)) return 0;
  CAST_CHECK_USAGE(!args.str("checkpoint").empty(), "--checkpoint is required (see cast attention --help)");
  const int64_t index = args.integer("index", 0, INT64_MAX);
  nn::AttentionConfig approximation;  // both approximations' clustering
  cli::read_attention_options(args, cli::kClusteredAttentionOptions, approximation);
  const std::vector<int64_t> asked = args.str("queries").empty()
                                         ? std::vector<int64_t>{}
                                         : cli::comma_integers("queries", args.str("queries"), 0, INT64_MAX);
  const train::TrainConfig trained = train::read_checkpoint_header(args.str("checkpoint")).config;
  train::check_outside_data(args.str("out"), "out", trained, args.str("data"));
  train::check_figure_output(args.str("out"), "out", args.str("checkpoint"), args.is_set("overwrite"));
  const nn::ModelConfig m = drawable_model(args.str("checkpoint"), trained);
  const int64_t layer = args.integer("layer", 1, m.layers), head = args.integer("head", 1, m.heads);
  train::TrainedRun run = train::open_trained_run(args.str("checkpoint"), args.str("data"), Device::cpu);
  CAST_CHECK_USAGE(index < static_cast<int64_t>(run.task.test.size()), "--index {} outside the {} test examples", index,
                   run.task.test.size());

  // The input of the chosen layer's attention, from the trained model.
  nn::Block& block = *run.model->blocks()[layer - 1];
  block.keep_attention_input = true;
  {
    autograd::NoGradGuard no_grad;
    run.model->forward(data::make_batch(run.task, run.task.test, {index}, DType::f32, Device::cpu), false);
  }
  const int offset = m.cls_pooling ? 1 : 0;
  const int64_t N = block.attention_input.dim(1), tokens = N - offset;
  for (int64_t q : asked)
    CAST_CHECK_USAGE(q < tokens, "--queries: {} is outside the input's {} tokens (0 to {})", q, tokens, tokens - 1);
  const std::vector<int64_t> queries =
      asked.empty() ? std::vector<int64_t>{tokens / 8, tokens * 3 / 8, tokens * 5 / 8, tokens * 7 / 8} : asked;

  train::AttentionPanels panels;
  panels.queries = queries;
  // more clusters than tokens fill nothing and cost minutes (C 65536 on 49 tokens)
  // the attention sees the class token too: its count is the bound, and is said as such
  const std::string seen = offset ? fmt::format("{} tokens the attention sees (the input's {} and the class token)",
                                                N, tokens)
                                  : fmt::format("{} tokens of the input", N);
  CAST_CHECK_USAGE(approximation.clusters <= N, "--clusters {} is more than the {}", approximation.clusters, seen);
  CAST_CHECK_USAGE(!args.is_set("topk") || approximation.topk <= N, "--topk {} is more than the {}", approximation.topk,
                   seen);
  const int64_t given_clusters = approximation.clusters;
  approximation.clusters = approximation.clusters > 0 ? approximation.clusters : nn::default_clusters(N);
  const auto every = mechanism_rows(panels, block, approximation, head, offset);
  // finite weights whose forward overflows (a diverged run's) give weights that are no numbers:
  // refused, not drawn as blank panels with a NaN "moved" figure
  const char* drawn[] = {"full", "clustered", "iclustered"};  // mechanism_rows' order
  for (size_t mi = 0; mi < every.size(); ++mi)
    for (const auto& row : every[mi])
      for (double w : row)
        CAST_CHECK(std::isfinite(w),
                   "checkpoint {}: the attention weights of layer {}, head {} on test example {} ({} attention) are "
                   "not finite numbers (the model's forward overflows there); nothing drawn",
                   args.str("checkpoint"), layer, head, index, drawn[mi]);
  const int64_t side = run.task.image_side / m.patch;
  panels.columns = run.task.image_side > 0 ? side : 32;
  panels.title =
      fmt::format("Attention weights: test example {}, layer {}, head {} ({} tokens)", index, layer, head, tokens);
  panels.note = fmt::format(
      "{}; a panel's shade: the key's weight over the largest of its row; red: the query; "
      "{}.",
      args.str("checkpoint"), run.task.image_side > 0 ? "keys laid out as the image's patches" : "keys in rows of 32");
  files::write_stamped(args.str("out"), train::attention_svg(panels), "--out");
  fmt::print(
      "cast attention: layer {}, head {}, test example {}: weight moved from full attention, mean over the {} "
      "queries\n",
      layer, head, index, tokens);
  print_moved_weight(panels, every, tokens);
  cli::note_default_clusters_against(nn::Mechanism::clustered, given_clusters, N, "the attention's input");
  fmt::print("-> {}\n", args.str("out"));
  return 0;
}

}  // namespace cast
