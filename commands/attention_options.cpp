#include "commands/attention_options.h"

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <string>

#include "tensor/error.h"

namespace cast::cli {

namespace {

struct Declared {
  AttentionOption option;
  const char* name;
  const char* fallback;
  const char* help;
  int64_t lo, hi;  // numbers only (hi 0: a choice)
};

using Limits = nn::AttentionLimits;
constexpr Declared kOptions[] = {
    {AttentionOption::clusters, "clusters", "0", "clusters C (0: ceil(sqrt(N)) rounded up to 8)", 0, Limits::clusters},
    {AttentionOption::cluster_size, "cluster-size", "0", "CAST cluster size K (0: the same default)", 0,
     Limits::cluster_size},
    {AttentionOption::clustering, "clustering", "topk", "CAST clustering: topk | satopk", 0, 0},
    {AttentionOption::f, "f", "softmax", "CAST attention function: softmax | laplace", 0, 0},
    {AttentionOption::summaries, "summaries", "on", "CAST cluster summaries: on | off", 0, 0},
    {AttentionOption::mix, "mix", "affinity", "CAST mixing weights: affinity | query", 0, 0},
    {AttentionOption::cast_heads, "cast-heads", "per-head", "CAST clustering: per-head | shared", 0, 0},
    {AttentionOption::topk, "topk", "32", "improved clustered: keys per cluster", 1, Limits::topk},
    {AttentionOption::bits, "bits", "63", "clustered: LSH hash bits", 1, Limits::bits},
    {AttentionOption::iterations, "iterations", "10", "clustered: Lloyd iterations", 0, Limits::iterations},
};

const Declared& declared(AttentionOption option) {
  for (const Declared& d : kOptions)
    if (d.option == option) return d;
  throw Error(fmt::format("attention options: option {} is not declared", static_cast<int>(option)));
}

}  // namespace

void add_attention_options(Args& args, std::initializer_list<AttentionOption> options, const char* scope) {
  for (AttentionOption option : options) {
    const Declared& d = declared(option);
    args.option(d.name, d.fallback, std::string(scope) + d.help);
  }
}

void read_attention_options(const Args& args, std::initializer_list<AttentionOption> options,
                            nn::AttentionConfig& config) {
  for (AttentionOption option : options) {
    const Declared& d = declared(option);
    switch (option) {
      case AttentionOption::clusters: config.clusters = args.integer(d.name, d.lo, d.hi); break;
      case AttentionOption::cluster_size: config.cluster_size = args.integer(d.name, d.lo, d.hi); break;
      case AttentionOption::clustering:
        config.single_assignment = args.choice(d.name, {"topk", "satopk"}) == "satopk";
        break;
      case AttentionOption::f:
        config.f = args.choice(d.name, {"softmax", "laplace"}) == "laplace" ? ops::AttentionFn::laplace
                                                                            : ops::AttentionFn::softmax;
        break;
      case AttentionOption::summaries: config.summaries = args.choice(d.name, {"on", "off"}) == "on"; break;
      case AttentionOption::mix: config.mix_query = args.choice(d.name, {"affinity", "query"}) == "query"; break;
      case AttentionOption::cast_heads:
        config.shared_clustering = args.choice(d.name, {"per-head", "shared"}) == "shared";
        break;
      case AttentionOption::topk: config.topk = args.integer(d.name, d.lo, d.hi); break;
      case AttentionOption::bits: config.bits = args.integer(d.name, d.lo, d.hi); break;
      case AttentionOption::iterations: config.iterations = args.integer(d.name, d.lo, d.hi); break;
    }
  }
}

std::vector<int64_t> attention_option_list(const Args& args, AttentionOption option) {
  const Declared& d = declared(option);
  CAST_CHECK(d.hi > 0, "attention options: --{} is a choice, not a number", d.name);
  return comma_integers(d.name, args.str(d.name), d.lo, d.hi);
}

// The mechanisms that read each attention option.
static const std::vector<std::pair<const char*, std::vector<nn::Mechanism>>>& option_readers() {
  using nn::Mechanism;
  static const std::vector<std::pair<const char*, std::vector<Mechanism>>> readers = {
      {"clusters", {Mechanism::cast, Mechanism::clustered, Mechanism::iclustered}},
      {"cluster-size", {Mechanism::cast}},
      {"clustering", {Mechanism::cast}},
      {"f", {Mechanism::cast}},
      {"summaries", {Mechanism::cast}},
      {"mix", {Mechanism::cast}},
      {"cast-heads", {Mechanism::cast}},
      {"surrogates", {Mechanism::cast}},
      {"topk", {Mechanism::iclustered}},
      {"bits", {Mechanism::clustered, Mechanism::iclustered}},
      {"iterations", {Mechanism::clustered, Mechanism::iclustered}}};
  return readers;
}

namespace {
// Whether any of `mechanisms` is among an option's `readers`.
bool read_by_any(const std::vector<nn::Mechanism>& readers, const std::vector<nn::Mechanism>& mechanisms) {
  for (nn::Mechanism m : mechanisms)
    if (std::find(readers.begin(), readers.end(), m) != readers.end()) return true;
  return false;
}

// The mechanisms as `selector` spells them, joined by `between` (bench's --mechanisms names
// CAST's two clusterings).
std::string spelled(const std::vector<nn::Mechanism>& mechanisms, const char* selector, const char* between) {
  std::vector<std::string> names;
  for (nn::Mechanism m : mechanisms)
    names.push_back(std::string(selector) == "--mechanisms" && m == nn::Mechanism::cast ? "cast-topk, cast-satopk"
                                                                                         : nn::mechanism_name(m));
  return fmt::format("{}", fmt::join(names, between));
}
}  // namespace

void check_option_read_by(const std::string& option, const std::vector<nn::Mechanism>& mechanisms,
                          const std::string& given_as, const char* selector) {
  for (const auto& [name, readers_of] : option_readers()) {
    if (option != name || read_by_any(readers_of, mechanisms)) continue;
    const std::string prefix = given_as.empty() ? "" : given_as + ": ";
    throw UsageError(fmt::format("{}--{} is an option of {} {}, not of {}", prefix, option, selector,
                                 spelled(readers_of, selector, " and "), spelled(mechanisms, selector, ", ")));
  }
}

void note_unread_config_options(const nlohmann::json& file, const std::vector<nn::Mechanism>& mechanisms,
                                const std::string& config) {
  if (!file.is_object()) return;
  for (const auto& [option, readers_of] : option_readers())
    if (file.contains(option) && !read_by_any(readers_of, mechanisms))
      fmt::print("note: {}: '{}' is an option of attention {}; it changes nothing for {}\n", config, option,
                 spelled(readers_of, "", " and "), spelled(mechanisms, "", ", "));
}

void check_options_of_mechanisms(const Args& args, const std::vector<nn::Mechanism>& mechanisms,
                                 const char* selector) {
  for (const auto& [option, readers_of] : option_readers())
    if (args.is_set(option)) check_option_read_by(option, mechanisms, "", selector);
}

void note_cluster_size_against(const nn::AttentionConfig& config, int64_t tokens, std::string_view of_what) {
  if (config.mechanism != nn::Mechanism::cast || tokens <= 0) return;
  // the default size is the default cluster count's: on a short sequence it reaches every token too
  const bool given = config.cluster_size > 0;
  const int64_t size = given ? config.cluster_size : nn::default_clusters(tokens);
  const int64_t clusters = config.clusters > 0 ? config.clusters : nn::default_clusters(tokens);
  if (clusters == 1 && size < tokens)  // a softmax (or normalised Laplace) over one cluster is 1 for every token
    fmt::print("note: CAST with one cluster: every token's affinity to it is 1, so the cluster is chosen by position "
               "(the first {} of the {} tokens of {}); give --clusters 2 or more\n",
               size, tokens, of_what);
  if (size < tokens) return;
  const std::string named = given ? fmt::format("cluster size {}", size) : fmt::format("the default cluster size, {},", size);
  const std::string capped = size > tokens ? fmt::format(" (a size above {} runs as {})", tokens, tokens) : "";
  if (config.single_assignment) {
    if (size > tokens) fmt::print("note: {} is more than the {} tokens of {}{}\n", named, tokens, of_what, capped);
    return;
  }
  fmt::print("note: {} >= the {} tokens of {}: every CAST cluster holds every token{}, which is full attention (the "
             "gate, the surrogates and CAST's options change nothing){}\n",
             named, tokens, of_what, capped,
             tokens > 1 ? fmt::format("; give --cluster-size below {}", tokens) : std::string());
}

void note_default_clusters_against(nn::Mechanism mechanism, int64_t given_clusters, int64_t tokens,
                                   std::string_view of_what) {
  if (mechanism == nn::Mechanism::full || given_clusters > 0 || tokens <= 0) return;
  const int64_t rounded = nn::default_clusters_unheld(tokens);
  if (rounded <= tokens) return;
  fmt::print("note: {} has {} token{}, fewer than the default {} clusters: the cluster count is {} (give --clusters "
             "to choose)\n",
             of_what, tokens, tokens == 1 ? "" : "s", rounded, tokens);
}

void note_cluster_counts_for(const nn::ModelConfig& model) {
  const int64_t tokens = model.tokens() + (model.cls_pooling ? 1 : 0);
  note_cluster_size_against(model.attention, tokens, "the longest sequence");
  note_default_clusters_against(model.attention.mechanism, model.attention.clusters, tokens, "the longest sequence");
  // a top-k above the tokens is refused where given, so one here is the default's
  if (model.attention.mechanism == nn::Mechanism::iclustered && model.attention.topk > tokens)
    fmt::print("note: the top-k, {}, is more than the {} tokens of the longest sequence: every key is a top key, "
               "held at {} (give --topk to choose)\n",
               model.attention.topk, tokens, tokens);
}

}  // namespace cast::cli
