#include "train/memory_estimate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/attention/cast_chain.h"
#include "ops/attention/fast_paths.h"
#include "tensor/device_memory.h"
#include "tensor/error.h"
#include "tensor/tensor.h"
#ifdef CAST_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace cast::train {

namespace {
constexpr double kFloat = 4;  // bytes of f32

// What one step of CAST's chain keeps for the backward, in floats, for bh groups (b·h).
double cast_step_floats(ops::Step step, double bh, double n, double c, double kappa, double dh) {
  switch (step) {
    case ops::Step::cluster_affinities: return bh * n * c * 2;  // scores and their softmax
    case ops::Step::gated_affinity: return bh * n * c;          // A_q − A_k
    case ops::Step::intra_cluster_attention:
      return bh * c * kappa * (kappa * 3 + dh * 4);             // slot scores, gathered q, k, v and out
    case ops::Step::cluster_summaries: return bh * c * dh * 4;  // the weights' sums and R_inter
    case ops::Step::combine_clusters: return bh * n * c;        // the slots' weights
    case ops::Step::full_attention:
    case ops::Step::improved_clustered_output:
    case ops::Step::cast_attention: break;
  }
  throw Error(fmt::format("memory estimate: {} is not a step of CAST's chain", ops::step_name(step)));
}
}  // namespace

LayerBytes attention_layer_parts(const nn::AttentionConfig& a, int64_t B, int64_t N, int64_t D, bool gpu) {
  const double b = static_cast<double>(B), n = static_cast<double>(N), d = static_cast<double>(D);
  const double h = static_cast<double>(a.heads), dh = d / std::max<double>(h, 1);
  double floats = b * n * d * 8;  // the input's gradient, q, k, v, their head layouts, the output
  double transient = 0;
  const double c = static_cast<double>(a.clusters > 0 ? a.clusters : nn::default_clusters(N));
  switch (a.mechanism) {
    case nn::Mechanism::full: {  // the step ops keep scores and probabilities (B, H, N, N); flash attention a row's
                                 // log-sum-exp
      const ops::StepSizes sizes{gpu ? Device::cuda : Device::cpu, DType::f32, static_cast<int64_t>(dh), 0};
      const bool flash = ops::choose_path(ops::Step::full_attention, a.fused, sizes) != nullptr;
      floats += flash ? b * h * n * 2 : b * h * n * n * 3;
      break;
    }
    case nn::Mechanism::cast: {
      const double kappa =
          static_cast<double>(std::min(a.cluster_size > 0 ? a.cluster_size : nn::default_clusters(N), N));
      const ops::CastOptions options{a.f, a.summaries, a.mix_query};
      const ops::StepSizes sizes{gpu ? Device::cuda : Device::cpu, DType::f32, static_cast<int64_t>(dh), 0};
      const ops::FastPath* one_op = nn::cast_runs_as_one_op(a, sizes.device)
                                        ? ops::choose_path(ops::Step::cast_attention, a.fused, sizes)
                                        : nullptr;
      if (one_op && std::string(one_op->name) == "cast_attention_recompute") {
        // the clusters from the forward to the backward; the chain's tape in the backward (more
        // than the chain's unrecorded forward, or Single-Assignment Top-K's choice, holds at once)
        floats += b * h * c * kappa;
        for (ops::Step step : ops::cast_chain_steps(options))
          transient += cast_step_floats(step, b * h, n, c, kappa, dh);
        break;
      }
      if (one_op) {
        // cast_attention_fused: the forward's A_q, A_k and A_g, (N, C) each per thread (at most one
        // thread per group; the backward's scratch is row tiles), and the slots' log-sum-exp and
        // weights; Single-Assignment Top-K forms A_q, A_k and A_g for the whole batch first
        const double threads = std::min(b * h, static_cast<double>(omp_get_max_threads()));
        floats += threads * n * c * 3 + b * h * c * (kappa * 2 + dh * 2 + 1);
        if (a.single_assignment) floats += b * h * n * c * 3;
        break;
      }
      for (ops::Step step : ops::cast_chain_steps(options)) floats += cast_step_floats(step, b * h, n, c, kappa, dh);
      break;
    }
    case nn::Mechanism::clustered:
    case nn::Mechanism::iclustered:
      floats += b * h * c * n * 3 + b * h * c * dh * 4;  // centroid scores, centroids, per-cluster outputs
      if (a.mechanism == nn::Mechanism::iclustered)      // the layer holds the top keys at N
        floats += b * h * c * std::min(static_cast<double>(a.topk), n) * (dh * 2 + 3);
      break;
  }
  return {floats * kFloat * 2, transient * kFloat * 2};  // and the gradients of as much again
}

double attention_layer_bytes(const nn::AttentionConfig& a, int64_t B, int64_t N, int64_t D, bool gpu) {
  return attention_layer_parts(a, B, N, D, gpu).total();
}

StepBytes training_step_parts(const nn::ModelConfig& m, int64_t B, int64_t N, bool gpu) {
  const int64_t towers = m.dual ? 2 : 1, tokens = N / (m.patch * m.patch) + (m.cls_pooling ? 1 : 0);
  const double bn = static_cast<double>(B * towers) * static_cast<double>(tokens);
  const double d = static_cast<double>(m.dim), mlp = static_cast<double>(m.mlp_dim);
  nn::AttentionConfig a = m.attention;
  a.dim = m.dim;
  a.heads = m.heads;
  const double layers = static_cast<double>(m.layers);
  // per block: two LayerNorms, residuals, projections, the MLP's hidden activations and GELU;
  // the linear layers as one op each (ops::linear) keep no product apart from its bias's sum, and
  // the MLP as one op (ops::mlp) keeps its hidden layer once
  const bool fused = m.attention.fused;
  const double block = bn * (d * (fused ? 5 : 6) + mlp * (fused ? 1 : 3)) * kFloat * 2;
  const double params = layers * (4 * d * d + 2 * d * mlp) +
                        static_cast<double>((m.patch > 1 ? m.patch * m.patch : m.vocab) + m.tokens() + 1) * d;
  StepBytes parts;
  parts.parameters = params * 4 * kFloat;
  const LayerBytes layer = attention_layer_parts(a, B * towers, tokens, m.dim, gpu);
  parts.recompute = m.recompute;
  if (m.recompute) {
    // each block keeps its input (and its gradient); one block's activations and attention
    // live at a time, during that block's backward
    parts.activations = layers * bn * d * 2 * kFloat + block + bn * d * 2 * kFloat;
    parts.attention = layer.total();
  } else {
    parts.activations = layers * block + bn * d * 2 * kFloat;
    parts.attention = layers * layer.kept + layer.transient;
  }
  switch (a.mechanism) {
    case nn::Mechanism::full: break;
    case nn::Mechanism::cast: parts.attention_options = "--clusters or --cluster-size"; break;
    case nn::Mechanism::clustered: parts.attention_options = "--clusters"; break;
    case nn::Mechanism::iclustered: parts.attention_options = "--clusters or --topk"; break;
  }
  return parts;
}

double training_step_bytes(const nn::ModelConfig& m, int64_t B, int64_t N, bool gpu) {
  return training_step_parts(m, B, N, gpu).total();
}

std::string StepBytes::largest() const {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  const char* or_recompute = recompute ? "" : ", or add --recompute";
  if (parameters >= activations && parameters >= attention)
    return fmt::format(
        "the parameters with their gradients and moments take {:.1f} GiB of it: lower --dim, "
        "--mlp-dim or --layers",
        parameters / GiB);
  if (activations >= attention)
    return fmt::format(
        "the layers' activations take {:.1f} GiB of it: lower --batch, --max-len, --dim, --mlp-dim or "
        "--layers{}",
        activations / GiB, or_recompute);
  return fmt::format("the attention layers take {:.1f} GiB of it: lower --batch or --max-len{}{}", attention / GiB,
                     attention_options.empty() ? "" : ", or " + attention_options, or_recompute);
}

namespace {
// What an address-space limit (ulimit -v) leaves this process beside what it has mapped already;
// a negative value where there is no limit.
double address_space_left() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  std::ifstream statm("/proc/self/statm");
  double mapped_pages = 0;
  statm >> mapped_pages;
  return std::max(0.0, static_cast<double>(limit.rlim_cur) - mapped_pages * static_cast<double>(::getpagesize()));
}
}  // namespace

// "512 MiB" below a GiB, "3.2 GiB" from there; "under 1 MiB" below that
static std::string in_mib_or_gib(double bytes) {
  constexpr double MiB = 1024.0 * 1024, GiB = 1024 * MiB;
  if (bytes < MiB) return "under 1 MiB";
  return bytes < GiB ? fmt::format("{:.0f} MiB", bytes / MiB) : fmt::format("{:.1f} GiB", bytes / GiB);
}
// "about 3 MiB", or "under 1 MiB"
static std::string about(double bytes) {
  const std::string size = in_mib_or_gib(bytes);
  return size.rfind("under", 0) == 0 ? size : "about " + size;
}

// Beside the work itself, the BLAS maps its work buffers at its first product (OpenBLAS: one of
// 128 MiB a thread and one more, seen in gdb), and where an address-space limit (ulimit -v)
// leaves no room for them it retries without end instead of failing (a run under ulimit -v
// 1100000 spun in blas_memory_alloc's mmap; cast eval in its malloc). A refusal where the limit
// leaves no room for them and `bytes`, work smaller than they are (else the work's own size is
// what to lower, which require_memory says); "" where they fit, or there is no limit.
static double blas_buffer_bytes() { return 128.0 * (1 << 20) * (omp_get_max_threads() + 1); }

static std::string blas_room_refusal(double bytes, const std::string& what) {
  const double left = address_space_left();
  const int threads = omp_get_max_threads();
  const double blas_buffers = blas_buffer_bytes();
  if (left < 0 || bytes >= blas_buffers || left >= blas_buffers + bytes) return "";
  struct rlimit limit {};
  ::getrlimit(RLIMIT_AS, &limit);
  return fmt::format(
      "{}{}the address-space limit (ulimit -v {} KiB) leaves {} beside what this process has mapped already (its "
      "libraries), where the BLAS's work buffers alone need {} ({} thread{}: 128 MiB each and one more): raise the "
      "limit by about {} KiB{}",
      what, bytes > 0 ? fmt::format(" needs {} (an estimate that errs high), but ", about(bytes)) : what.empty() ? "" : ": ",
      limit.rlim_cur / 1024, in_mib_or_gib(left), in_mib_or_gib(blas_buffers), threads, threads == 1 ? "" : "s",
      // the libraries map a little more as they start their work: 64 MiB to spare, to a MiB
      (static_cast<uint64_t>((bytes + blas_buffers - left) / (1 << 20)) + 65) * 1024,
      threads > 1 ? ", or run fewer threads (OMP_NUM_THREADS)" : "");
}

void require_blas_room(const std::string& what) {
  if (const std::string refusal = blas_room_refusal(0, what); !refusal.empty()) throw Error(refusal);
}

void require_memory(double bytes, Device device, const std::string& what, const std::string& hint) {
  double available = static_cast<double>(host_memory_total());
  const char* where = "this machine has";
  bool known = available > 0;  // 0: the machine's memory could not be read, and nothing is refused
  // the estimate errs high: a limit below the machine's memory is what the run meets first
  if (const double left = address_space_left(); left >= 0 && (available <= 0 || left < available)) {
    // a limit the libraries and their buffers take nearly whole: no setting of the run helps
    if (const std::string refusal = blas_room_refusal(bytes, what); !refusal.empty()) throw Error(refusal);
    available = std::max(0.0, left - blas_buffer_bytes());
    where = "the address-space limit (ulimit -v) leaves, beside the BLAS's work buffers,";
    known = true;
  }
#ifdef CAST_WITH_CUDA
  if (device == Device::cuda) {
    const auto gpus = cuda::devices();
    available = gpus.empty() ? 0.0 : static_cast<double>(gpus[0].total_bytes);
    known = available > 0;
    where = "the GPU has";
  }
#endif
  (void)device;
  if (!known || bytes <= available) return;
  const bool limited = std::string_view(where).find("ulimit") != std::string_view::npos;
  throw Error(fmt::format("{} needs {} (an estimate that errs high) but {} {}: {}{}", what, about(bytes), where,
                          in_mib_or_gib(available), hint, limited ? "; or raise the limit" : ""));
}

}  // namespace cast::train
