// The index bookkeeping of the clustered ops on the device: what the step ops of ops/attention/ compute in
// host loops for CPU tensors, here without a round trip.
#include "cuda/attention/cluster_index.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace cast::cuda {

namespace {

__global__ void weight_index_kernel(int32_t* out, const int32_t* members, int64_t total, int64_t clusters,
                                    int64_t kappa) {
  CAST_KERNEL_LOOP(e, total) {
    const int64_t m = members[e];
    out[e] = m >= 0 ? static_cast<int32_t>(m * clusters + (e / kappa) % clusters) : -1;
  }
}

__global__ void count_kernel(float* counts, const int32_t* assignment, int64_t total, int64_t n, int64_t clusters) {
  CAST_KERNEL_LOOP(e, total) {
    const int64_t c = assignment[e];
    if (c >= 0 && c < clusters) atomicAdd(counts + (e / n) * clusters + c, 1.f);  // exact: whole numbers below 2^24
  }
}

__global__ void invert_kernel(float* counts, int64_t total) {
  CAST_KERNEL_LOOP(e, total)
  counts[e] = counts[e] > 0.f ? static_cast<float>(1.0 / static_cast<double>(counts[e])) : 0.f;
}

__global__ void slots_kernel(float* slots, const int32_t* top_keys, const int32_t* assignment, int64_t total,
                             int64_t clusters, int64_t n, int64_t top) {
  CAST_KERNEL_LOOP(e, total) {  // e = (g·N + i)·top + s
    const int64_t row = e / top, s = e % top, g = row / n;
    const int64_t j = assignment[row];
    slots[e] = j >= 0 && j < clusters && top_keys[(g * clusters + j) * top + s] >= 0 ? 1.f : 0.f;
  }
}

__global__ void outside_kernel(float* outside, const int32_t* top_keys, int64_t total, int64_t n, int64_t top) {
  CAST_KERNEL_LOOP(e, total) {  // e = r·top + s; writers of one entry all write 0
    const int64_t key = top_keys[e];
    if (key >= 0 && key < n) outside[(e / top) * n + key] = 0.f;
  }
}

__global__ void repeat_heads_kernel(int32_t* out, const int32_t* in, int64_t total, int64_t heads, int64_t width) {
  CAST_KERNEL_LOOP(e, total) {  // e = (b·H + h)·E + k
    const int64_t k = e % width, b = e / width / heads;
    out[e] = in[b * width + k];
  }
}

}  // namespace

void member_weight_index(Tensor& weight_index, const Tensor& members, int64_t clusters, int64_t kappa) {
  const int64_t total = members.numel();
  if (total == 0) return;
  CAST_LAUNCH(weight_index_kernel, blocks_for(total), kThreads, 0, weight_index.data<int32_t>(),
              members.data<int32_t>(), total, clusters, kappa);
  CUDA_CHECK_LAUNCH();
}

void cluster_counts(Tensor& counts, const Tensor& assignment, int64_t clusters, bool inverse) {
  counts.fill_zero();
  const int64_t total = assignment.numel(), n = assignment.dim(1);
  if (total > 0)
    CAST_LAUNCH(count_kernel, blocks_for(total), kThreads, 0, fptr(counts), assignment.data<int32_t>(), total, n,
                clusters);
  if (inverse && counts.numel() > 0)
    CAST_LAUNCH(invert_kernel, blocks_for(counts.numel()), kThreads, 0, fptr(counts), counts.numel());
  CUDA_CHECK_LAUNCH();
}

void top_key_slots(Tensor& slots, const Tensor& top_keys, const Tensor& assignment, int64_t clusters, int64_t n,
                   int64_t top) {
  if (slots.numel() == 0) return;
  CAST_LAUNCH(slots_kernel, blocks_for(slots.numel()), kThreads, 0, fptr(slots), top_keys.data<int32_t>(),
              assignment.data<int32_t>(), slots.numel(), clusters, n, top);
  CUDA_CHECK_LAUNCH();
}

void clear_top_keys(Tensor& outside, const Tensor& top_keys, int64_t n, int64_t top) {
  if (top_keys.numel() == 0) return;
  CAST_LAUNCH(outside_kernel, blocks_for(top_keys.numel()), kThreads, 0, fptr(outside), top_keys.data<int32_t>(),
              top_keys.numel(), n, top);
  CUDA_CHECK_LAUNCH();
}

void repeat_heads(Tensor& out, const Tensor& in, int64_t heads) {
  const int64_t total = out.numel();
  if (total == 0) return;
  CAST_LAUNCH(repeat_heads_kernel, blocks_for(total), kThreads, 0, out.data<int32_t>(), in.data<int32_t>(), total,
              heads, in.numel() / in.dim(0));
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
