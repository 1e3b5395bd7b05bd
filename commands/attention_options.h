#pragma once
// The attention options that several commands take (`layer`, `bench`, `attention`, `eval`),
// declared once: one name, one help line and the limits cast train's settings check
// (nn::AttentionLimits). A command lists the ones it takes; `eval` reads the numbers as lists.
#include <initializer_list>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/cli.h"
#include "nn/attention.h"
#include "nn/transformer.h"

namespace cast::cli {

enum class AttentionOption {
  clusters,
  cluster_size,
  clustering,
  f,
  summaries,
  mix,
  cast_heads,
  topk,
  bits,
  iterations
};

// Clustered and improved clustered attention's clustering: what `attention` and `eval` take to
// run those mechanisms in place of a trained one.
inline constexpr std::initializer_list<AttentionOption> kClusteredAttentionOptions = {
    AttentionOption::clusters, AttentionOption::topk, AttentionOption::bits, AttentionOption::iterations};

// Declares the options on args; `scope` starts each help line (bench: "attention: ").
void add_attention_options(Args& args, std::initializer_list<AttentionOption> options, const char* scope = "");
// Reads them into config, each number checked against its limit (a usage error naming the flag).
void read_attention_options(const Args& args, std::initializer_list<AttentionOption> options,
                            nn::AttentionConfig& config);
// A numeric option as a comma-separated list, each value within the option's limits.
std::vector<int64_t> attention_option_list(const Args& args, AttentionOption option);
// A flag that none of `mechanisms` reads (`--attention full --topk 3`) is refused, not ignored:
// "--topk is an option of --attention iclustered, not of full".
// `selector` is the flag that names the mechanisms (bench's --mechanisms).
void check_options_of_mechanisms(const Args& args, const std::vector<nn::Mechanism>& mechanisms,
                                 const char* selector = "--attention");
// The same for one option however it was given (`given_as`, e.g. "--vary topk"): an attention
// option none of `mechanisms` reads is refused; any other option passes.
void check_option_read_by(const std::string& option, const std::vector<nn::Mechanism>& mechanisms,
                          const std::string& given_as = "", const char* selector = "--attention");

// The keys of a settings file that are options of mechanisms none of `mechanisms` reads, said in
// one note line each. Not refused, as such flags are: one file may serve several mechanisms.
void note_unread_config_options(const nlohmann::json& file, const std::vector<nn::Mechanism>& mechanisms,
                                const std::string& config);

// CAST's cluster size (given, or the default) against the `tokens` of `of_what` ("the longest
// sequence"): a size above them runs as their count, and with Top-K a size at least their count
// puts every token in every cluster, which is full attention whose gate and surrogates learn
// nothing (docs/attention.md). One cluster of fewer than all tokens is chosen by position: every
// token's affinity to the only cluster is 1.
// Each is said in one note line before the work, which is valid, so that nothing is silent.
void note_cluster_size_against(const nn::AttentionConfig& config, int64_t tokens, std::string_view of_what);

// The default cluster count (⌈√N⌉ rounded up to a multiple of 8) held at the `tokens` of `of_what`
// because they are fewer: said in one note line when `given_clusters` is 0 (the default) and
// `mechanism` clusters, so that a count the user never chose is not silent.
void note_default_clusters_against(nn::Mechanism mechanism, int64_t given_clusters, int64_t tokens,
                                   std::string_view of_what);

// Both notes above for a model's longest sequence (its tokens and the class token).
void note_cluster_counts_for(const nn::ModelConfig& model);

}  // namespace cast::cli
