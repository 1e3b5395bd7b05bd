// CAST steps 1–3 and 5–7 as the chain of the step ops; the reference of cast_attention_fused.cpp.
#include <cmath>
#include <vector>

#include "autograd/tape.h"
#include "autograd/trace.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/clustering.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/step_blocks.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::ops {
using namespace step_blocks;

// ---------------------------------------------------------------- CAST steps 1–3, 5–7
Tensor cast_attention(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                      const Tensor& mask, const Tensor& members, AttentionFn f, bool summaries, bool mix_query) {
  check_cast_attention_inputs("cast_attention", g, q, k, v, s, mask, members);
  Tensor a_q = cluster_affinities(q, s, f);  // (B, H, N, C)
  Tensor a_k = cluster_affinities(k, s, f);
  Tensor w = a_q;
  if (!mix_query) {
    autograd::StepScope named("gated_affinity");
    w = mix_affinities(g, a_q, a_k);
  }
  Tensor r_intra = intra_cluster_attention(q, k, v, members);
  Tensor r_inter = summaries ? cluster_summaries(a_k, v, mask) : Tensor();
  return combine_clusters(w, r_intra, r_inter, members);
}

}  // namespace cast::ops
