// One table of cases for every fast path against its reference, in the manner of ggml's
// test-backend-ops. For each path registered in ops/attention/fast_paths.h × each device here (the CPU; the
// CUDA device where there is one: emulated in cast_emu_tests, the real GPU in a GPU build) ×
// f32 and f64 × three random shapes with padding, the fast path and the step-by-step reference
// run on the same inputs on the same device and must agree: the output and the gradient of
// every float input. New tensors start poisoned (tests/test_env.cpp), so an element a kernel
// never writes fails; every input's gradient starts from random values, so a backward that
// overwrites instead of adding fails too.
//
// On the CUDA device, f32 cases run once more at each reduced precision (tensor/precision.h: the
// tensor-core flash kernels, cuBLAS's TF32 and BF16 products) against the reference at fp32,
// held in norm to 8 units of the format's roundoff: 8·2^-11 for TF32, 8·2^-8 for BF16 (a path
// that chooses its clusters, against the reference given the clusters it chose).
//
// Adding a kernel: its own file with its row (ops/attention/fast_paths.h), the row in ops::fast_paths(), and, for a
// step no path had before, that step's row in kCases below (the test fails for a path whose step has none).
#include <cmath>
#include <map>
#include <string>

#include "ops/attention/steps.h"
#include "ops/attention/fast_paths.h"
#include "tensor/philox.h"
#include "tensor/precision.h"
#include "tests/device_compare.h"
#include "tests/random_clusters.h"
#include "tests/devices.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;

namespace {

// Sizes drawn from one seed; the first case of each path is the smallest the step allows.
struct Draw {
  uint64_t seed;
  uint64_t n = 0;
  int64_t between(int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<int64_t>(philox::uniform(seed, n++) * static_cast<double>(hi - lo + 1)) % (hi - lo + 1);
  }
  bool small() const { return seed % 3 == 0; }
};

struct Case {
  ops::StepInputs inputs;  // on the CPU; float inputs require gradients
  std::string label;
};

Tensor leaf(const Shape& shape, uint64_t seed, DType dtype, double lo = -2.0, double hi = 2.0) {
  return Tensor::uniform(shape, seed, 0, lo, hi, dtype).set_requires_grad();
}

// (B, N) key mask with a random padded tail per batch row; with two rows or more, the last
// row is all padding every other seed (a query with no real key).
Tensor padding_mask(Draw& r, int64_t B, int64_t N, DType dtype) {
  std::vector<int64_t> padding;
  for (int64_t b = 0; b < B; ++b)
    padding.push_back(b == B - 1 && B > 1 && r.seed % 2 == 1 ? N : r.between(0, std::max<int64_t>(N / 2, 0)));
  return tail_mask(N, padding, dtype);
}

Case affinities_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 2), G = r.between(1, 3), N = r.small() ? 1 : r.between(2, 700);
  const int64_t C = r.small() ? 1 : r.between(2, 40), w = r.small() ? 1 : r.between(2, 40);
  const ops::AttentionFn f = r.seed % 2 == 0 ? ops::AttentionFn::softmax : ops::AttentionFn::laplace;
  return {ops::ClusterAffinitiesInputs{leaf({B, G, N, w}, r.seed + 1, t), leaf({G, C, w}, r.seed + 2, t), f},
          fmt::format("B{} G{} N{} C{} w{} {}", B, G, N, C, w, f == ops::AttentionFn::softmax ? "softmax" : "laplace")};
}

Case gated_affinity_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 3), G = r.between(1, 3), N = r.small() ? 1 : r.between(2, 600);
  const int64_t C = r.small() ? 1 : r.between(2, 20), D = r.small() ? 1 : r.between(2, 40);
  return {ops::GatedAffinityInputs{leaf({B, N, D}, r.seed + 1, t), leaf({D, G}, r.seed + 2, t),
                                   leaf({G}, r.seed + 3, t), leaf({B, G, N, C}, r.seed + 4, t, 0.0, 1.0),
                                   leaf({B, G, N, C}, r.seed + 5, t, 0.0, 1.0)},
          fmt::format("B{} G{} N{} C{} D{}", B, G, N, C, D)};
}

Case full_attention_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 2), H = r.between(1, 2), M = r.small() ? 1 : r.between(2, 70);
  const int64_t N = r.small() ? 1 : r.between(2, 90), d = r.small() ? 1 : r.between(2, 40);
  Tensor mask = r.seed % 4 == 2 ? Tensor() : padding_mask(r, B, N, t);
  return {ops::FullAttentionInputs{leaf({B, H, M, d}, r.seed + 1, t), leaf({B, H, N, d}, r.seed + 2, t),
                                   leaf({B, H, N, d}, r.seed + 3, t), mask},
          fmt::format("B{} H{} M{} N{} d{}{}", B, H, M, N, d, mask.defined() ? " padded" : "")};
}

Case intra_cluster_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 2), H = r.between(1, 2), N = r.small() ? 2 : r.between(3, 70);
  const int64_t C = r.small() ? 1 : r.between(2, 7), kappa = r.small() ? 1 : r.between(2, 37);
  const int64_t d = r.small() ? 1 : r.between(2, 36);
  return {ops::IntraClusterAttentionInputs{leaf({B, H, N, d}, r.seed + 1, t), leaf({B, H, N, d}, r.seed + 2, t),
                                           leaf({B, H, N, d}, r.seed + 3, t),
                                           random_members(B, H, C, kappa, N, r.seed + 4)},
          fmt::format("B{} H{} N{} C{} kappa{} d{}", B, H, N, C, kappa, d)};
}

Case summaries_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 3), H = r.between(1, 2), N = r.small() ? 1 : r.between(2, 300);
  const int64_t C = r.small() ? 1 : r.between(2, 9), d = r.small() ? 1 : r.between(2, 20);
  Tensor mask = r.seed % 4 == 2 ? Tensor() : padding_mask(r, B, N, t);
  return {ops::ClusterSummariesInputs{leaf({B, H, N, C}, r.seed + 1, t, 0.05, 1.0), leaf({B, H, N, d}, r.seed + 2, t),
                                      mask},
          fmt::format("B{} H{} N{} C{} d{}{}", B, H, N, C, d, mask.defined() ? " padded" : "")};
}

Case combine_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 2), H = r.between(1, 2), N = r.small() ? 1 : r.between(2, 40);
  const int64_t C = r.small() ? 1 : r.between(2, 7), kappa = r.small() ? 1 : r.between(2, 12);
  const int64_t d = r.small() ? 1 : r.between(2, 24);
  const bool summaries = r.seed % 2 == 0;
  return {ops::CombineClustersInputs{
              leaf({B, H, N, C}, r.seed + 1, t, 0.0, 1.0), leaf({B, H, C, kappa, d}, r.seed + 2, t),
              summaries ? leaf({B, H, C, d}, r.seed + 3, t) : Tensor(), random_members(B, H, C, kappa, N, r.seed + 4)},
          fmt::format("B{} H{} N{} C{} kappa{} d{} summaries {}", B, H, N, C, kappa, d, summaries ? "on" : "off")};
}

Case improved_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 2), H = r.between(1, 2), N = r.small() ? 2 : r.between(3, 60);
  const int64_t C = r.small() ? 1 : r.between(2, 6), top = r.small() ? 1 : r.between(2, 12);
  const int64_t d = r.small() ? 1 : r.between(2, 24);
  return {ops::ImprovedClusteredOutputInputs{
              leaf({B, H, N, d}, r.seed + 1, t), leaf({B, H, N, d}, r.seed + 2, t), leaf({B, H, N, d}, r.seed + 3, t),
              leaf({B, H, C, N}, r.seed + 4, t, 0.0, 1.0), random_members(B, H, C, top, N, r.seed + 5),
              random_assignment(B, H, N, C, r.seed + 6)},
          fmt::format("B{} H{} N{} C{} top{} d{}", B, H, N, C, top, d)};
}

Case cast_attention_case(Draw& r, DType t) {
  const int64_t B = r.between(1, 2), H = r.between(1, 3), N = r.small() ? 1 : r.between(2, 150);
  const int64_t C = r.small() ? 1 : r.between(2, 9), kappa = r.small() ? 1 : r.between(2, 20);
  const int64_t d = r.small() ? 1 : r.between(2, 24);
  const ops::CastOptions o{r.seed % 2 == 0 ? ops::AttentionFn::softmax : ops::AttentionFn::laplace, r.between(0, 2) > 0,
                           r.between(0, 2) == 0};
  Tensor mask = r.seed % 4 == 2 ? Tensor() : padding_mask(r, B, N, t);
  // one case in three leaves step 4 (Top-K on A_g) to the step itself, as the layer runs it
  const bool chooses = r.seed % 3 == 1;
  return {
      ops::CastAttentionInputs{leaf({B, N, H}, r.seed + 1, t, 0.0, 1.0), leaf({B, H, N, d}, r.seed + 4, t),
                               leaf({B, H, N, d}, r.seed + 5, t), leaf({B, H, N, d}, r.seed + 6, t),
                               leaf({H, C, d}, r.seed + 7, t), mask,
                               chooses ? Tensor() : random_members(B, H, C, kappa, N, r.seed + 8), o, kappa},
      fmt::format("B{} H{} N{} C{} kappa{} d{} {} summaries {} mix {}{}{}", B, H, N, C, kappa, d,
                  o.f == ops::AttentionFn::softmax ? "softmax" : "laplace", o.summaries ? "on" : "off",
                  o.mix_query ? "query" : "affinity", mask.defined() ? " padded" : "", chooses ? " Top-K inside" : "")};
}

using MakeCase = Case (*)(Draw&, DType);
const std::map<ops::Step, MakeCase> kCases = {
    {ops::Step::cluster_affinities, affinities_case},      {ops::Step::gated_affinity, gated_affinity_case},
    {ops::Step::full_attention, full_attention_case},      {ops::Step::intra_cluster_attention, intra_cluster_case},
    {ops::Step::cluster_summaries, summaries_case},        {ops::Step::combine_clusters, combine_case},
    {ops::Step::improved_clustered_output, improved_case}, {ops::Step::cast_attention, cast_attention_case},
};

struct PathRun {
  Tensor out;
  std::vector<Tensor> grads;  // one per input; undefined for constants
};

// Device copies of the inputs; an undefined input (no mask, summaries off) stays undefined.
std::vector<Tensor> copies(const std::vector<Tensor>& inputs, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(t.defined() ? copy_inputs({t}, device)[0] : Tensor());
  return out;
}

// One forward and backward on fresh device copies of the inputs, gradients prefilled.
PathRun run_once(const std::function<Tensor(const ops::StepInputs&)>& fn, const ops::StepInputs& step_inputs,
                 Device device, const Tensor& dout_cpu) {
  const std::vector<Tensor> inputs = ops::tensors_of(step_inputs);
  std::vector<Tensor> in = copies(inputs, device);
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].defined() && in[i].requires_grad()) in[i].set_grad(prefilled_grad(inputs[i], i).to(device));
  PathRun run;
  run.out = fn(ops::with_tensors(step_inputs, in));
  autograd::backward(run.out, dout_cpu.to(run.out.dtype()).to(device));
  autograd::clear_tape();
  for (const Tensor& t : in)
    run.grads.push_back(t.defined() && t.requires_grad() ? t.grad().to(Device::cpu) : Tensor());
  run.out = run.out.to(Device::cpu);
  return run;
}

// The output's shape, from a forward that records nothing.
Shape reference_shape(const Case& c) {
  autograd::NoGradGuard no_grad;
  return ops::run_reference(c.inputs).shape();
}

// ‖got − want‖ / ‖want‖ over every element (want's norm taken as 1 where it is 0).
double relative_norm_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to_double_vector(), b = want.to_double_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (a[i] == b[i]) continue;  // equal infinities too
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  for (size_t i = 0; i < b.size(); ++i) den += std::isfinite(b[i]) && a[i] == b[i] ? b[i] * b[i] : 0.0;
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

Tensor sub(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_double_vector();
  const std::vector<double> y = b.to_double_vector();
  for (size_t i = 0; i < x.size(); ++i) x[i] -= y[i];
  return Tensor::from_vector<double>(x, a.shape());
}

// The path at a reduced precision. Where the step chooses its clusters (CAST's Top-K inside), the
// choice comes back in `chosen`.
struct ReducedRun : PathRun {
  Tensor chosen;
};
ReducedRun run_reduced(const ops::FastPath& path, const Case& c, Device device, const Tensor& dout,
                       Precision precision) {
  ReducedRun run;
  ops::StepInputs inputs = c.inputs;
  if (auto* cast = std::get_if<ops::CastAttentionInputs>(&inputs); cast && !cast->members.defined())
    cast->chosen = &run.chosen;
  PrecisionGuard at(precision);
  static_cast<PathRun&>(run) = run_once([&](const ops::StepInputs& x) { return path.run(x); }, inputs, device, dout);
  return run;
}

// What a reduced run is held to: the reference at fp32. A cluster choice is discrete, and where
// two affinities nearly tie a reduced precision may choose the other; a run that chose its own
// clusters is held to the reference given those clusters.
PathRun reference_for(const Case& c, const ReducedRun& reduced, Device device, const Tensor& dout,
                      const PathRun& fp32) {
  if (!reduced.chosen.defined()) return fp32;
  ops::StepInputs inputs = c.inputs;
  std::get<ops::CastAttentionInputs>(inputs).members = reduced.chosen.to(Device::cpu);
  return run_once([&](const ops::StepInputs& x) { return ops::run_reference(x); }, inputs, device, dout);
}

class FastPathAgainstReference : public ::testing::TestWithParam<size_t> {};

}  // namespace

TEST_P(FastPathAgainstReference, ValuesAndEveryGradient) {
  const ops::FastPath& path = ops::fast_paths().at(GetParam());
  const auto make = kCases.find(path.step);
  ASSERT_NE(make, kCases.end()) << path.name << ": its step " << ops::step_name(path.step) << " has no row in kCases";
  int ran = 0;
  for (Device device : devices_here())
    for (DType dtype : {DType::f32, DType::f64})
      for (uint64_t seed = 0; seed < 3; ++seed) {
        Draw draw{1000 * (GetParam() + 1) + seed};
        const Case c = make->second(draw, dtype);
        ops::StepSizes sizes = ops::sizes_of(c.inputs);
        sizes.device = device;
        if (!path.fits(sizes)) continue;
        SCOPED_TRACE(fmt::format("{} on {} {} {}", path.name, device == Device::cpu ? "cpu" : "cuda", dtype_name(dtype),
                                 c.label));
        ASSERT_EQ(ops::choose_path(path.step, true, sizes), &path)
            << "an earlier registered path of the same step takes these inputs: this one would never run";
        const Tensor dout = Tensor::uniform(reference_shape(c), 77 + seed, 0, -1.0, 1.0, DType::f64);
        const PathRun want =
            run_once([&](const ops::StepInputs& x) { return ops::run_reference(x); }, c.inputs, device, dout);
        const PathRun got = run_once([&](const ops::StepInputs& x) { return path.run(x); }, c.inputs, device, dout);
        const double rtol = dtype == DType::f32 ? 1e-4 : 1e-10, atol = dtype == DType::f32 ? 1e-5 : 1e-12;
        expect_close_per_element(got.out, want.out, rtol, atol, "output");
        const std::vector<Tensor> tensors = ops::tensors_of(c.inputs);
        for (size_t i = 0; i < tensors.size(); ++i)
          if (want.grads[i].defined())
            expect_close_per_element(got.grads[i], want.grads[i], rtol, atol, fmt::format("gradient of input {}", i));
        ++ran;
        if (device != Device::cuda || dtype != DType::f32) continue;
        for (auto [precision, tolerance] :
             {std::pair{Precision::tf32, 8 * 0x1p-11}, std::pair{Precision::bf16, 8 * 0x1p-8}}) {
          const ReducedRun reduced = run_reduced(path, c, device, dout, precision);
          const PathRun held = reference_for(c, reduced, device, dout, want);
          const char* name = precision_name(precision);
          EXPECT_LE(relative_norm_error(reduced.out, held.out), tolerance) << "output at " << name;
          for (size_t i = 0; i < tensors.size(); ++i)
            if (held.grads[i].defined()) {  // what the backward added to the prefilled gradient
              const Tensor before = prefilled_grad(tensors[i], i).to(DType::f64);
              EXPECT_LE(relative_norm_error(sub(reduced.grads[i].to(DType::f64), before),
                                            sub(held.grads[i].to(DType::f64), before)),
                        tolerance)
                  << "gradient of input " << i << " at " << name;
            }
        }
      }
  if (ran == 0) GTEST_SKIP() << path.name << " supports no device of this build (" << path.supports << ")";
}

INSTANTIATE_TEST_SUITE_P(Registry, FastPathAgainstReference, ::testing::Range<size_t>(0, ops::fast_paths().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(ops::fast_paths().at(info.param).name);
                         });

// Every step with a fast path has a reference, and the choice is made in one place: with fast
// paths off, every step runs its reference on every device.
TEST(FastPaths, ReferenceWhenOffOnEveryDevice) {
  for (ops::Step step : ops::kSteps)
    for (Device device : {Device::cpu, Device::cuda})
      for (DType dtype : {DType::f32, DType::f64})
        EXPECT_EQ(ops::choose_path(step, false, {device, dtype, 64, 32}), nullptr) << ops::step_name(step);
}

// Each registered path names its reference step, its file and what it supports, and the CPU has
// a fast path for the steps whose reference stores a matrix per query (full attention, the
// intra-cluster tiles, improved clustered attention's per-query top keys).
TEST(FastPaths, RegistryDescribesEachPath) {
  for (const ops::FastPath& path : ops::fast_paths()) {
    EXPECT_TRUE(std::string(path.file).rfind("ops/", 0) == 0) << path.name;
    EXPECT_FALSE(std::string(path.supports).empty()) << path.name;
  }
  for (ops::Step step :
       {ops::Step::full_attention, ops::Step::intra_cluster_attention, ops::Step::improved_clustered_output})
    EXPECT_NE(ops::choose_path(step, true, {Device::cpu, DType::f32, 64, 32}), nullptr) << ops::step_name(step);
}
