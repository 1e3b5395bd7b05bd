// `cast eval`: a checkpoint on its task's validation and test splits, or a sweep of mechanisms.
#include "commands/commands.h"

#include "commands/attention_options.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/tape.h"
#include "tensor/files.h"
#include "train/cli.h"
#include "figures/cluster_changes.h"
#include "figures/clusters_figure.h"
#include "figures/plot.h"
#include "train/run_folder.h"
#include "train/trace.h"
#include "train/trainer.h"

namespace cast {

using json = nlohmann::json;

namespace {

// As training stops at a loss that is no number, so does an evaluation, before it reports an
// accuracy that means nothing.
void check_finite_loss(const train::EvalResult& val, const train::EvalResult& test, const std::string& checkpoint,
                       const std::string& attention) {
  for (const auto& [split, r] : {std::pair{"validation", &val}, std::pair{"test", &test}})
    CAST_CHECK(r->examples == 0 || std::isfinite(r->loss),
               "checkpoint {}: the {} loss is {} (attention {}): the model's outputs are not finite numbers, so its "
               "accuracy means nothing",
               checkpoint, split, r->loss, attention);
}

void print_eval(const std::string& name, const train::EvalResult& r) {
  if (r.examples == 0) return fmt::print("  {:<19} no examples\n", name);
  fmt::print("  {:<19} {:.2f}%  loss {:.4f}  ({} examples; majority class {:.2f}% of them)\n", name, 100 * r.accuracy,
             r.loss, r.examples, 100 * r.majority);
}

// The tokens of the sequences the model's attention sees (CLS included).
int64_t sequence_tokens(const train::TrainedRun& run) {
  const nn::ModelConfig& m = run.checkpoint.config.model;
  return std::min(m.tokens(), run.task.max_len / (m.patch * m.patch)) + (m.cls_pooling ? 1 : 0);
}

// What the evaluation reads: examples longer than the model's sequences are cut, and said so;
// more clusters than tokens fill nothing and cost minutes (C 65536 on 49 tokens), and are refused.
void check_evaluation(const train::TrainedRun& run, const std::vector<int64_t>& clusters,
                      const std::vector<int64_t>& topks, bool swapped, int64_t limit) {
  const int64_t n = sequence_tokens(run);
  for (int64_t c : clusters)
    CAST_CHECK_USAGE(!swapped || c <= n, "--clusters {} is more than the {} tokens of the model's sequences", c, n);
  std::vector<int64_t> counts;  // 0 is the default count: the same row as that count given
  for (int64_t c : clusters) counts.push_back(c > 0 ? c : nn::default_clusters(n));
  for (size_t i = 0; i < counts.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      CAST_CHECK_USAGE(counts[i] != counts[j],
                       "--clusters: {} and {} are both {} clusters for the model's {} tokens (0 is the default): "
                       "list it once",
                       clusters[j], clusters[i], counts[i], n);
  for (int64_t k : topks)
    CAST_CHECK_USAGE(!swapped || k <= n, "--topk {} is more than the {} tokens of the model's sequences", k, n);
  const auto cut = [&](const std::vector<data::Example>& split) {  // among the examples evaluated
    const auto end = limit > 0 && static_cast<size_t>(limit) < split.size() ? split.begin() + limit : split.end();
    return std::count_if(split.begin(), end, [](const data::Example& e) { return e.cut; });
  };
  const int64_t cut_val = cut(run.task.val), cut_test = cut(run.task.test);
  if (cut_val + cut_test > 0)
    fmt::print("note: the model reads {} tokens: {} validation and {} test examples are cut to their first {}\n",
               run.checkpoint.config.model.max_len, cut_val, cut_test, run.checkpoint.config.model.max_len);
}

// Every mechanism x top keys x C of the lists, evaluated with the trained model's weights: a
// Markdown table and, with `figure`, test accuracy against C.
void eval_sweep(const train::TrainedRun& run, const std::vector<std::string>& mechanisms,
                const std::vector<int64_t>& clusters, const std::vector<int64_t>& topks,
                const nn::AttentionConfig& base, int64_t limit, Device device, const std::string& checkpoint,
                const std::string& figure) {
  const train::Checkpoint& trained_ck = run.checkpoint;
  nn::Transformer& trained = *run.model;
  const data::TaskData& task = run.task;
  const int64_t batch = trained_ck.config.batch;
  // each row starts from the checkpoint's draws, as a single evaluation of it does (clustered
  // attention's hashes follow the model's forward count, which the trained model's row advances)
  const uint64_t start_offset = trained.rng_offset;
  const std::vector<uint64_t> start_draws = trained.clustering_draws();
  // validation before test, as a single evaluation does: the LSH draws follow the forward count
  const auto trained_val = train::evaluate(trained, task, task.val, batch, limit, device);
  const auto trained_test = train::evaluate(trained, task, task.test, batch, limit, device);
  check_finite_loss(trained_val, trained_test, checkpoint,
                    nn::mechanism_name(trained_ck.config.model.attention.mechanism));
  // the sequence the attention sees, for the defaults C = 0 and top keys above it
  const int64_t n = sequence_tokens(run);
  fmt::print("{} (step {}, task {}, trained with {} attention), evaluated with the same weights:\n\n", checkpoint,
             trained_ck.step, trained_ck.config.task, nn::mechanism_name(trained_ck.config.model.attention.mechanism));
  fmt::print("| attention | C | top keys | test % | validation % |\n|---|---|---|---|---|\n");
  fmt::print("| {} (trained) | | | {:.2f} | {:.2f} |\n",
             nn::mechanism_name(trained_ck.config.model.attention.mechanism), 100 * trained_test.accuracy,
             100 * trained_val.accuracy);
  std::vector<train::Line> lines;
  for (const std::string& name : mechanisms) {
    const nn::Mechanism mechanism = nn::parse_mechanism(name);
    const bool top = mechanism == nn::Mechanism::iclustered;
    for (int64_t k : top ? topks : std::vector<int64_t>{topks.front()}) {
      train::Line line{top ? fmt::format("{}, {} top keys", name, k) : name, {}, {}};
      // full attention reads no cluster count: evaluated once, drawn flat across the counts
      const bool full = mechanism == nn::Mechanism::full;
      train::EvalResult val, test;
      for (size_t i = 0; i < clusters.size(); ++i) {
        const int64_t c = clusters[i];
        const int64_t clusters_used = c > 0 ? c : nn::default_clusters(n);
        if (!full || i == 0) {
          nn::AttentionConfig a = base;
          a.mechanism = mechanism, a.clusters = c, a.topk = k;
          const auto swapped = train::with_attention(trained, a, device);
          swapped->rng_offset = start_offset;
          swapped->set_clustering_draws(start_draws);
          val = train::evaluate(*swapped, task, task.val, batch, limit, device);
          test = train::evaluate(*swapped, task, task.test, batch, limit, device);
          check_finite_loss(val, test, checkpoint, line.label);
          fmt::print("| {} | {} | {} | {:.2f} | {:.2f} |\n", name, full ? "" : std::to_string(clusters_used),
                     top ? std::to_string(std::min(k, n)) : "", 100 * test.accuracy, 100 * val.accuracy);
          std::fflush(stdout);
        }
        line.xs.push_back(static_cast<double>(clusters_used));
        line.ys.push_back(test.accuracy);
      }
      lines.push_back(line);
    }
  }
  if (figure.empty()) return;
  train::Line reference{"trained model", {}, {}, true};
  reference.xs = lines.front().xs;
  reference.ys.assign(reference.xs.size(), trained_test.accuracy);
  lines.push_back(reference);
  train::plot_lines(figure, fmt::format("{}: test accuracy with the trained weights", trained_ck.config.task),
                    "clusters C", lines);
  fmt::print("\n-> {}\n", figure);
}

cli::Args eval_args() {
  cli::Args args("eval",
                 "Evaluate a checkpoint on the validation and test splits of its task; with --attention, with another "
                 "mechanism and the same weights (a full-attention model approximated by clustered attention, "
                 "without retraining). Lists (--attention clustered,iclustered --clusters 4,8,16) evaluate every "
                 "combination and print one table.");
  args.option("checkpoint", "", "checkpoint file (required)")
      .option("data", "", "data folder (default: the one the run used)")
      .option("device", "auto", "auto | cpu | cuda")
      .option("eval-limit", "0", "examples per split (0: all)")
      .option("precision", "",
              "products on the GPU: fp32 | tf32 | bf16 (default: the checkpoint's on the GPU, fp32 on the CPU)")
      .option("attention", "",
              "evaluate with this mechanism instead, or a comma-separated list: full | clustered | iclustered (CAST "
              "is refused: its surrogates and gate are not in a model trained without them)");
  cli::add_attention_options(args, cli::kClusteredAttentionOptions,
                             "with --attention (clusters and topk may be lists): ");
  args.option("figure", "", "with --attention: an SVG of test accuracy against C, one line per mechanism")
      .flag("overwrite", "replace an existing --figure that is not a cast figure")
      .example("cast eval --checkpoint runs/listops-short-cast/checkpoint.safetensors")
      .example("cast eval --checkpoint runs/fashion-mnist-cast/best.safetensors --eval-limit 1000")
      .example(
          "cast eval --checkpoint runs/fashion-mnist-full/checkpoint.safetensors --attention iclustered "
          "--clusters 8")
      .example(
          "cast eval --checkpoint runs/fm-full/checkpoint.safetensors --attention clustered,iclustered --clusters "
          "4,8,16,32 --topk 4,8 --figure approximation.svg");
  return args;
}

// --attention's mechanisms and the clustering they take, checked before any file is read; without
// --attention, its options are refused.
struct Swap {
  nn::AttentionConfig attention;
  std::vector<std::string> mechanisms;
  std::vector<int64_t> clusters, topks;
};

Swap swap_of(const cli::Args& args) {
  const std::string swap = args.str("attention");
  CAST_CHECK_USAGE(!args.is_set("overwrite") || !args.str("figure").empty(),
                   "--overwrite replaces an existing --figure, and none is given");
  for (const char* option : {"clusters", "topk", "bits", "iterations"})
    CAST_CHECK_USAGE(!swap.empty() || !args.is_set(option),
                     "--{} is an option of the mechanism --attention swaps in, and none is given (without "
                     "--attention the checkpoint's own settings are used)",
                     option);
  CAST_CHECK_USAGE(!swap.empty() || !args.is_set("figure"),
                   "--figure draws a sweep of --attention (and --clusters), and no --attention is given: name the "
                   "mechanisms to evaluate, e.g. --attention full,clustered");
  Swap s;
  if (swap.empty()) return s;
  s.mechanisms = cli::comma_list("attention", swap);
  for (const std::string& m : s.mechanisms)
    CAST_CHECK_USAGE(m == "full" || m == "clustered" || m == "iclustered" || m == "cast",
                     "--attention must be full, clustered or iclustered, got '{}'", m);
  s.attention.mechanism = nn::parse_mechanism(s.mechanisms.front());
  // an option none of the listed mechanisms reads is refused rather than printed as if it applied
  const auto some_reads = [&](std::initializer_list<const char*> readers) {
    return std::any_of(s.mechanisms.begin(), s.mechanisms.end(), [&](const std::string& m) {
      return std::find_if(readers.begin(), readers.end(), [&](const char* r) { return m == r; }) != readers.end();
    });
  };
  for (const char* option : {"clusters", "bits", "iterations"})
    CAST_CHECK_USAGE(!args.is_set(option) || some_reads({"clustered", "iclustered"}),
                     "--{} is an option of --attention clustered and iclustered, not of {}", option, swap);
  CAST_CHECK_USAGE(!args.is_set("topk") || some_reads({"iclustered"}),
                   "--topk is an option of --attention iclustered, not of {}", swap);
  s.clusters = cli::attention_option_list(args, cli::AttentionOption::clusters);
  s.topks = cli::attention_option_list(args, cli::AttentionOption::topk);
  cli::read_attention_options(args, {cli::AttentionOption::bits, cli::AttentionOption::iterations}, s.attention);
  s.attention.clusters = s.clusters.front();
  s.attention.topk = s.topks.front();
  return s;
}

// The validation and test accuracy of the run's model, with `swap`'s attention in place of the
// trained one when given.
void evaluate_once(train::TrainedRun& run, const nn::AttentionConfig* swap, int64_t limit, Device device,
                   const std::string& checkpoint) {
  const nn::Mechanism trained = run.checkpoint.config.model.attention.mechanism;
  if (swap) train::swap_attention(run, *swap, device);
  const train::Checkpoint& ck = run.checkpoint;
  nn::Transformer& model = *run.model;
  const data::TaskData& task = run.task;
  auto val = train::evaluate(model, task, task.val, ck.config.batch, limit, device);
  auto test = train::evaluate(model, task, task.test, ck.config.batch, limit, device);
  std::string how = nn::mechanism_name(trained);
  if (swap) {
    const nn::AttentionConfig& a = ck.config.model.attention;
    const std::string clusters = a.mechanism == nn::Mechanism::full
                                     ? ""
                                     : fmt::format("; clusters {}", a.clusters > 0 ? std::to_string(a.clusters)
                                                                                   : "ceil(sqrt(N)) rounded up to 8");
    const bool hashed = a.mechanism == nn::Mechanism::clustered || a.mechanism == nn::Mechanism::iclustered;
    how = fmt::format("{} in place of the trained {}, the same weights{}{}{}", nn::mechanism_name(a.mechanism),
                      nn::mechanism_name(trained), clusters,
                      a.mechanism == nn::Mechanism::iclustered ? fmt::format(", top keys {}", a.topk) : "",
                      hashed ? fmt::format(", {} hash bits, {} iterations", a.bits, a.iterations) : "");
  }
  check_finite_loss(val, test, checkpoint, how);
  fmt::print("{} (step {}, task {}, attention {})\n", checkpoint, ck.step, ck.config.task, how);
  print_eval("validation accuracy", val);
  print_eval("test accuracy", test);
}

}  // namespace

// The clustering options --attention was not given, taken from the trained model where it has
// them (a clustered or improved clustered model): swapped for its own mechanism, or for the other
// of the two, it runs with its own hashes, iterations, cluster count and top keys, not with the
// options' defaults.
void inherit_trained_options(Swap& s, const nn::AttentionConfig& trained, const cli::Args& args) {
  using M = nn::Mechanism;
  if (trained.mechanism != M::clustered && trained.mechanism != M::iclustered) return;
  if (!args.is_set("bits")) s.attention.bits = trained.bits;
  if (!args.is_set("iterations")) s.attention.iterations = trained.iterations;
  if (!args.is_set("clusters")) s.clusters = {trained.clusters}, s.attention.clusters = trained.clusters;
  if (!args.is_set("topk") && trained.mechanism == M::iclustered) s.topks = {trained.topk}, s.attention.topk = trained.topk;
}

int command_eval(const std::vector<std::string>& argv) {
  cli::Args args = eval_args();
  if (!args.parse(argv)) return 0;
  const int64_t limit = args.integer("eval-limit", 0, int64_t{1} << 40);
  CAST_CHECK_USAGE(!args.str("checkpoint").empty(), "--checkpoint is required (see cast eval --help)");
  const std::string swap = args.str("attention");
  Swap s = swap_of(args);
  const nn::AttentionConfig& attention = s.attention;
  const std::vector<std::string>& mechanisms = s.mechanisms;
  const std::vector<int64_t>&clusters = s.clusters, &topks = s.topks;
  const std::string figure = args.str("figure");
  if (!figure.empty()) {
    train::check_outside_data(figure, "figure", train::read_checkpoint_header(args.str("checkpoint")).config,
                              args.str("data"));
    train::check_figure_output(figure, "figure", args.str("checkpoint"), args.is_set("overwrite"));
  }
  // eval computes a tf32 or bf16 checkpoint in fp32 on the CPU by itself: no resume advice here
  const Device device = train::resolve_device(args.str("device"));
  if (!args.str("precision").empty()) train::use_precision(args.str("precision"), device);
  train::TrainedRun run = train::open_trained_run(args.str("checkpoint"), args.str("data"), device);
  if (!run.data_note.empty()) fmt::print("{}\n", run.data_note);
  if (!swap.empty()) inherit_trained_options(s, run.checkpoint.config.model.attention, args);
  check_evaluation(run, clusters, args.is_set("topk") ? topks : std::vector<int64_t>{}, !mechanisms.empty(), limit);
  if (args.str("precision").empty())
    train::use_precision(device == Device::cuda ? run.checkpoint.config.precision : "fp32", device);
  const bool sweep = mechanisms.size() > 1 || clusters.size() > 1 || topks.size() > 1 || !figure.empty();
  if (sweep) {
    for (const std::string& name : mechanisms)  // refused before any evaluation
      train::check_swappable(run.checkpoint.config.model.attention.mechanism, nn::parse_mechanism(name));
    eval_sweep(run, mechanisms, clusters, topks, attention, limit, device, args.str("checkpoint"), figure);
    return 0;
  }
  evaluate_once(run, swap.empty() ? nullptr : &attention, limit, device, args.str("checkpoint"));
  return 0;
}

}  // namespace cast
