#include "ops/attention/fast_paths.h"

#include "autograd/trace.h"
#include "ops/attention/cast_chain.h"
#include "ops/attention/steps.h"
#include "ops/rows.h"

namespace cast::ops {

const char* step_name(Step step) {
  switch (step) {
    case Step::cluster_affinities: return "cluster_affinities";
    case Step::gated_affinity: return "gated_affinity";
    case Step::full_attention: return "full_attention";
    case Step::intra_cluster_attention: return "intra_cluster_attention";
    case Step::cluster_summaries: return "cluster_summaries";
    case Step::combine_clusters: return "combine_clusters";
    case Step::improved_clustered_output: return "improved_clustered_output";
    case Step::cast_attention: return "cast_attention";
  }
  throw Error(fmt::format("step_name: no step {}", static_cast<int>(step)));
}

static_assert(std::variant_size_v<StepInputs> == std::size(kSteps), "one inputs struct per step, in Step's order");

Step step_of(const StepInputs& inputs) { return kSteps[inputs.index()]; }

std::vector<Tensor> tensors_of(StepInputs inputs) {
  std::vector<Tensor> out;
  std::visit([&](auto& in) { std::apply([&](auto&... t) { (out.push_back(t), ...); }, in.fields()); }, inputs);
  return out;
}

StepInputs with_tensors(StepInputs inputs, const std::vector<Tensor>& tensors) {
  std::visit(
      [&](auto& in) {
        constexpr size_t count = std::tuple_size_v<decltype(in.fields())>;
        CAST_CHECK(tensors.size() == count, "{}: {} tensors given, it takes {}", step_name(step_of(inputs)),
                   tensors.size(), count);
        size_t i = 0;
        std::apply([&](auto&... t) { ((t = tensors[i++]), ...); }, in.fields());
      },
      inputs);
  return inputs;
}

// ---------------------------------------------------------------- each step's sizes and reference
namespace {

StepSizes sizes(const Tensor& first, int64_t head_width, int64_t top_keys = 0) {
  return {first.device(), first.dtype(), head_width, top_keys};
}
StepSizes sizes(const ClusterAffinitiesInputs& in) { return sizes(in.x, in.x.dim(-1)); }
StepSizes sizes(const GatedAffinityInputs& in) { return sizes(in.x, in.x.dim(-1)); }
StepSizes sizes(const FullAttentionInputs& in) { return sizes(in.q, in.q.dim(-1)); }
StepSizes sizes(const IntraClusterAttentionInputs& in) { return sizes(in.q, in.q.dim(-1)); }
StepSizes sizes(const ClusterSummariesInputs& in) { return sizes(in.a_k, in.v.dim(-1)); }
StepSizes sizes(const CombineClustersInputs& in) { return sizes(in.w, in.r_intra.dim(-1)); }
StepSizes sizes(const ImprovedClusteredOutputInputs& in) { return sizes(in.q, in.q.dim(-1), in.top_keys.dim(-1)); }
StepSizes sizes(const CastAttentionInputs& in) { return sizes(in.g, in.q.dim(-1)); }

Tensor reference(const ClusterAffinitiesInputs& in) { return cluster_affinities(in.x, in.s, in.f); }
Tensor reference(const GatedAffinityInputs& in) { return gated_affinity(in.x, in.gate_w, in.gate_b, in.a_q, in.a_k); }
Tensor reference(const FullAttentionInputs& in) { return full_attention(in.q, in.k, in.v, in.mask); }
Tensor reference(const IntraClusterAttentionInputs& in) {
  return intra_cluster_attention(in.q, in.k, in.v, in.members);
}
Tensor reference(const ClusterSummariesInputs& in) { return cluster_summaries(in.a_k, in.v, in.mask); }
Tensor reference(const CombineClustersInputs& in) { return combine_clusters(in.w, in.r_intra, in.r_inter, in.members); }
Tensor reference(const ImprovedClusteredOutputInputs& in) {
  return improved_clustered_output(in.q, in.k, in.v, in.a_c, in.top_keys, in.assignment);
}
Tensor reference(const CastAttentionInputs& in) {
  if (in.members.defined())
    return cast_attention(in.g, in.q, in.k, in.v, in.s, in.mask, in.members, in.options.f, in.options.summaries,
                          in.options.mix_query);
  // Top-K inside: the chain chooses the clusters from the A_g it forms
  CAST_CHECK(in.cluster_size >= 1, "cast_attention: cluster size must be >= 1, got {}", in.cluster_size);
  CastChainInputs chain;
  chain.q = in.q, chain.k = in.k, chain.v = in.v, chain.s = in.s, chain.mask = in.mask, chain.g = in.g;
  chain.options = in.options;
  CastChain c = cast_chain(chain, run_reference, choose_clusters(in.mask, in.cluster_size, false));
  if (in.chosen) *in.chosen = c.members;
  return c.out;
}

}  // namespace

StepSizes sizes_of(const StepInputs& inputs) {
  CAST_CHECK(tensors_of(inputs).front().defined(), "{}: its first input is undefined", step_name(step_of(inputs)));
  return std::visit([](const auto& in) { return sizes(in); }, inputs);
}

Tensor run_reference(const StepInputs& inputs) {
  return std::visit([](const auto& in) { return reference(in); }, inputs);
}

// ---------------------------------------------------------------- the table
const std::vector<FastPath>& fast_paths() {
  static const std::vector<FastPath> table = {
      cluster_affinities_fused_path(),
      gated_affinity_fused_path(),
      flash_attention_path(),
      intra_cluster_attention_fused_path(),
      intra_cluster_attention_flash_path(),
      cluster_summaries_fused_path(),
      combine_clusters_fused_path(),
      improved_clustered_output_fused_path(),
      improved_clustered_output_topkey_path(),
      cast_attention_fused_path(),
      cast_attention_recompute_path(),
  };
  return table;
}

const FastPath* choose_path(Step step, bool fast, const StepSizes& sizes) {
  if (!fast) return nullptr;
  for (const FastPath& path : fast_paths())
    if (path.step == step && path.fits(sizes)) return &path;
  return nullptr;
}

Tensor run_step(bool fast, const StepInputs& inputs) {
  const Step step = step_of(inputs);
  autograd::StepScope named(step_name(step));
  const FastPath* path = choose_path(step, fast, sizes_of(inputs));
  if (!path) return run_reference(inputs);
  autograd::FastPathScope by(path->name);  // its nodes name it in a trace
  return path->run(inputs);
}

// ---------------------------------------------------------------- shared input checks
static void check_heads(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float(op, q, "q");
  check_ndim(op, q, 4, "q");
  check_same_shape(op, q, k);
  check_same_shape(op, q, v);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, q, k);
  check_same_device(op, q, v);
}

void check_cluster_affinities_inputs(const char* op, const Tensor& x, const Tensor& s) {
  check_float(op, x, "x");
  check_ndim(op, x, 4, "x");
  check_ndim(op, s, 3, "surrogates");
  check_same_dtype(op, x, s);
  check_same_device(op, x, s);
  CAST_CHECK(s.dim(0) == x.dim(1) && s.dim(2) == x.dim(3), "{}: surrogates {} do not fit x {} (want [{}, C, {}])", op,
             s.describe(), x.describe(), x.dim(1), x.dim(3));
}

void check_gated_affinity_inputs(const char* op, const Tensor& x, const Tensor& gate_w, const Tensor& gate_b,
                                 const Tensor& a_q, const Tensor& a_k) {
  check_float(op, x, "x");
  check_ndim(op, x, 3, "x");
  check_ndim(op, a_q, 4, "a_q");
  check_same_shape(op, a_q, a_k);
  for (const Tensor* t : {&gate_w, &gate_b, &a_q, &a_k}) {
    check_same_dtype(op, x, *t);
    check_same_device(op, x, *t);
  }
  const int64_t B = x.dim(0), N = x.dim(1), D = x.dim(2), G = a_q.dim(1);
  CAST_CHECK(a_q.dim(0) == B && a_q.dim(2) == N, "{}: a_q {} does not fit x {} (want [{}, G, {}, C])", op,
             a_q.describe(), x.describe(), B, N);
  CAST_CHECK(gate_w.shape() == (Shape{D, G}) && gate_b.shape() == Shape{G},
             "{}: gate_w {} and gate_b {} must be [{}, {}] and [{}]", op, gate_w.describe(), gate_b.describe(), D, G,
             G);
}

void check_intra_cluster_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& members) {
  check_heads(op, q, k, v);
  check_ndim(op, members, 4, "members");
  check_dtype(op, members, DType::i32, "members");
  check_same_device(op, q, members);
  CAST_CHECK(members.dim(0) == q.dim(0) && members.dim(1) == q.dim(1), "{}: members {} do not fit q {}", op,
             members.describe(), q.describe());
  check_index_range(op, members, -1, q.dim(2));
}

void check_cast_attention_inputs(const char* op, const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& s, const Tensor& mask, const Tensor& members) {
  check_heads(op, q, k, v);
  check_ndim(op, s, 3, "surrogates");
  for (const Tensor* t : {&g, &s}) {
    check_same_dtype(op, q, *t);
    check_same_device(op, q, *t);
  }
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  CAST_CHECK(g.shape() == (Shape{B, N, H}), "{}: gate {} does not fit q {} (want [{}, {}, {}])", op, g.describe(),
             q.describe(), B, N, H);
  CAST_CHECK(s.dim(0) == H && s.dim(2) == d, "{}: surrogates {} do not fit q {} (want [{}, C, {}])", op, s.describe(),
             q.describe(), H, d);
  if (mask.defined()) {
    check_same_dtype(op, q, mask);
    check_same_device(op, q, mask);
    CAST_CHECK(mask.shape() == (Shape{B, N}), "{}: mask {} must be [{}, {}]", op, mask.describe(), B, N);
  }
  check_intra_cluster_inputs(op, q, k, v, members);
  CAST_CHECK(members.dim(2) == s.dim(1), "{}: members {} name {} clusters, the surrogates {}", op, members.describe(),
             members.dim(2), s.dim(1));
}

void check_improved_clustered_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& a_c, const Tensor& top_keys, const Tensor& assignment) {
  check_heads(op, q, k, v);
  check_same_dtype(op, q, a_c);
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2);
  CAST_CHECK(a_c.ndim() == 4 && a_c.dim(0) == B && a_c.dim(1) == H && a_c.dim(3) == N,
             "{}: a_c {} must be [{}, {}, C, {}]", op, a_c.describe(), B, H, N);
  const int64_t C = a_c.dim(2);
  check_dtype(op, top_keys, DType::i32, "top_keys");
  check_dtype(op, assignment, DType::i32, "assignment");
  CAST_CHECK(top_keys.ndim() == 4 && top_keys.dim(0) == B && top_keys.dim(1) == H && top_keys.dim(2) == C,
             "{}: top_keys {} must be [{}, {}, {}, k]", op, top_keys.describe(), B, H, C);
  CAST_CHECK(assignment.shape() == (Shape{B, H, N}), "{}: assignment {} must be [{}, {}, {}]", op,
             assignment.describe(), B, H, N);
  check_same_device(op, q, a_c);
  check_same_device(op, q, top_keys);
  check_same_device(op, q, assignment);
  check_index_range(op, top_keys, -1, N);
  check_index_range(op, assignment, -1, C);
}

}  // namespace cast::ops
