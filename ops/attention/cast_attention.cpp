// CAST steps 1–3 and 5–7 as the chain of the step ops (ops/attention/cast_chain.h); the reference
// of cast_attention_fused.cpp.
#include "ops/attention/cast_chain.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/steps.h"

namespace cast::ops {

Tensor cast_attention(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                      const Tensor& mask, const Tensor& members, AttentionFn f, bool summaries, bool mix_query) {
  check_cast_attention_inputs("cast_attention", g, q, k, v, s, mask, members);
  CastChainInputs in;
  in.q = q, in.k = k, in.v = v, in.s = s, in.mask = mask, in.g = g, in.members = members;
  in.options = {f, summaries, mix_query};
  return cast_chain(in, run_reference).out;
}

}  // namespace cast::ops
