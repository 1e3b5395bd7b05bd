#include "ops/fast.h"

#include "autograd/trace.h"
#include "ops/attention.h"
#include "ops/flash_attention.h"
#include "ops/rows.h"
#ifdef CAST_WITH_CUDA
#include "cuda/combine.h"
#include "cuda/topkey_attention.h"
#endif

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
    default: return "cast_attention";
  }
}

StepSizes sizes_of(Step step, const std::vector<Tensor>& in) {
  CAST_CHECK(!in.empty() && in[0].defined(), "{}: no inputs", step_name(step));
  StepSizes s{in[0].device(), in[0].dtype(), in[0].dim(-1), 0};
  if (step == Step::cluster_summaries) s.head_width = in.at(1).dim(-1);        // v
  if (step == Step::combine_clusters) s.head_width = in.at(1).dim(-1);         // r_intra
  if (step == Step::improved_clustered_output) s.top_keys = in.at(4).dim(-1);  // top_keys
  if (step == Step::cast_attention) s.head_width = in.at(1).dim(-1);           // q
  return s;
}

namespace {
bool cpu_float(const StepSizes& s) { return s.device == Device::cpu && is_float(s.dtype); }
bool cuda_f32(const StepSizes& s) { return s.device == Device::cuda && s.dtype == DType::f32; }
// The CUDA flash kernels are compiled for head widths up to 128 (cuda/flash_attention.cu).
bool flash_fits(const StepSizes& s) { return cpu_float(s) || (cuda_f32(s) && s.head_width <= 128); }
bool cuda_flash_fits(const StepSizes& s) { return cuda_f32(s) && s.head_width <= 128; }
bool summaries_fits(const StepSizes& s) { return cpu_float(s) || cuda_f32(s); }
bool combine_fits(const StepSizes& s) {
#ifdef CAST_WITH_CUDA
  return cpu_float(s) || (cuda_f32(s) && s.head_width <= cuda::kCombineMaxHead);
#else
  return cpu_float(s);
#endif
}
bool topkey_fits(const StepSizes& s) {
#ifdef CAST_WITH_CUDA
  return cuda_f32(s) && cuda::topkey_attention_fits(s.top_keys, s.head_width);
#else
  (void)s;
  return false;
#endif
}

const Tensor& at(const std::vector<Tensor>& in, size_t i) { return in.at(i); }
Tensor opt(const std::vector<Tensor>& in, size_t i) { return i < in.size() ? in[i] : Tensor(); }
}  // namespace

const std::vector<FastPath>& fast_paths() {
  static const std::vector<FastPath> table = {
      {"cluster_affinities_fused", Step::cluster_affinities, "ops/cluster_affinities_fused.cpp",
       "CPU f32/f64, softmax and Laplace rows", cpu_float,
       [](const std::vector<Tensor>& in, const StepOptions& o) {
         return cluster_affinities_fused(at(in, 0), at(in, 1), o.f);
       }},
      {"gated_affinity_fused", Step::gated_affinity, "ops/gated_affinity_fused.cpp", "CPU f32/f64", cpu_float,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return gated_affinity_fused(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4));
       }},
      {"flash_attention", Step::full_attention, "ops/flash_attention.cpp",
       "CPU f32/f64; CUDA f32 with head width up to 128", flash_fits,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return flash_attention(at(in, 0), at(in, 1), at(in, 2), opt(in, 3));
       }},
      {"intra_cluster_attention_fused", Step::intra_cluster_attention, "ops/intra_cluster_fused.cpp", "CPU f32/f64",
       cpu_float,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return intra_cluster_attention_fused(at(in, 0), at(in, 1), at(in, 2), at(in, 3));
       }},
      {"intra_cluster_attention_flash", Step::intra_cluster_attention, "ops/intra_cluster_flash.cpp",
       "CUDA f32 with head width up to 128", cuda_flash_fits,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return intra_cluster_attention_flash(at(in, 0), at(in, 1), at(in, 2), at(in, 3));
       }},
      {"cluster_summaries_fused", Step::cluster_summaries, "ops/summaries_fused.cpp", "CPU f32/f64; CUDA f32",
       summaries_fits,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return cluster_summaries_fused(at(in, 0), at(in, 1), opt(in, 2));
       }},
      {"combine_clusters_fused", Step::combine_clusters, "ops/combine_fused.cpp",
       "CPU f32/f64; CUDA f32 with head width up to 128", combine_fits,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return combine_clusters_fused(at(in, 0), at(in, 1), opt(in, 2), at(in, 3));
       }},
      {"improved_clustered_output_fused", Step::improved_clustered_output, "ops/improved_clustered_fused.cpp",
       "CPU f32/f64", cpu_float,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return improved_clustered_output_fused(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4), at(in, 5));
       }},
      {"improved_clustered_output_topkey", Step::improved_clustered_output, "ops/topkey_attention.cpp",
       "CUDA f32 where a cluster's top-key gradients fit in shared memory", topkey_fits,
       [](const std::vector<Tensor>& in, const StepOptions&) {
         return improved_clustered_output_topkey(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4), at(in, 5));
       }},
      {"cast_attention_fused", Step::cast_attention, "ops/cast_attention_fused.cpp", "CPU f32/f64, per-head clustering",
       cpu_float,
       [](const std::vector<Tensor>& in, const StepOptions& o) {
         return cast_attention_fused(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4), opt(in, 5), at(in, 6), o);
       }},
  };
  return table;
}

Tensor run_reference(Step step, const std::vector<Tensor>& in, const StepOptions& options) {
  switch (step) {
    case Step::cluster_affinities: return cluster_affinities(at(in, 0), at(in, 1), options.f);
    case Step::gated_affinity: return gated_affinity(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4));
    case Step::full_attention: return full_attention(at(in, 0), at(in, 1), at(in, 2), opt(in, 3));
    case Step::intra_cluster_attention: return intra_cluster_attention(at(in, 0), at(in, 1), at(in, 2), at(in, 3));
    case Step::cluster_summaries: return cluster_summaries(at(in, 0), at(in, 1), opt(in, 2));
    case Step::combine_clusters: return combine_clusters(at(in, 0), at(in, 1), opt(in, 2), at(in, 3));
    case Step::improved_clustered_output:
      return improved_clustered_output(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4), at(in, 5));
    default:
      return cast_attention(at(in, 0), at(in, 1), at(in, 2), at(in, 3), at(in, 4), opt(in, 5), at(in, 6), options.f,
                            options.summaries, options.mix_query);
  }
}

const FastPath* choose_path(Step step, bool fast, const StepSizes& sizes) {
  if (!fast) return nullptr;
  for (const FastPath& path : fast_paths())
    if (path.step == step && path.fits(sizes)) return &path;
  return nullptr;
}

Tensor run_step(Step step, bool fast, const std::vector<Tensor>& inputs, const StepOptions& options) {
  autograd::StepScope named(step_name(step));
  const FastPath* path = choose_path(step, fast, sizes_of(step, inputs));
  if (!path) return run_reference(step, inputs, options);
  autograd::FastPathScope by(path->name);  // its nodes name it in a trace
  return path->run(inputs, options);
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
