#pragma once
// The attention options that several commands take (`layer`, `bench`, `attention`, `eval`),
// declared once: one name, one help line and the limits cast train's settings check
// (nn::AttentionLimits). A command lists the ones it takes; `eval` reads the numbers as lists.
#include <initializer_list>
#include <vector>

#include "train/cli.h"
#include "nn/attention.h"

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
void check_options_of_mechanisms(const Args& args, const std::vector<nn::Mechanism>& mechanisms);
// The same for one option however it was given (`given_as`, e.g. "--vary topk"): an attention
// option none of `mechanisms` reads is refused; any other option passes.
void check_option_read_by(const std::string& option, const std::vector<nn::Mechanism>& mechanisms,
                          const std::string& given_as = "");

}  // namespace cast::cli
