// Cross-entropy from log-probabilities (computed by the softmax kernel).
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/loss.h"
#include "math/topk_order.h"

namespace cast::cuda {

// One block: the mean of −logp[r, label[r]] over labelled rows, and their count.
template <class I>
__global__ void ce_forward_kernel(float* loss, float* count_out, const float* logp, const I* labels, int64_t rows,
                                  int64_t classes) {
  float total = 0, count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t y = labels[r];
    if (y < 0 || y >= classes) continue;  // ignored, or out of range (reported by the deferred check)
    total -= logp[r * classes + y];
    count += 1.f;
  }
  total = block_reduce<false>(total);
  count = block_reduce<false>(count);
  if (threadIdx.x == 0) {
    loss[0] = count > 0.f ? total / count : 0.f;
    count_out[0] = count;
  }
}

template <class I>
__global__ void ce_backward_kernel(float* dlogits, const float* dloss, const float* logp, const I* labels,
                                   const float* count, int64_t rows, int64_t classes) {
  if (count[0] == 0.f) return;
  const float inv_count = 1.f / count[0];
  CAST_KERNEL_LOOP(e, rows * classes) {
    const int64_t r = e / classes, c = e % classes;
    const int64_t y = labels[r];
    if (y < 0 || y >= classes) continue;
    dlogits[e] += dloss[0] * inv_count * (expf(logp[e]) - (c == y ? 1.f : 0.f));
  }
}

void cross_entropy_forward(Tensor& loss, Tensor& count, const Tensor& logp, const Tensor& labels, int64_t rows,
                           int64_t classes) {
  if (labels.dtype() == DType::i32)
    CAST_LAUNCH(ce_forward_kernel<int32_t>, 1, 1024, 0, fptr(loss), fptr(count), fptr(logp), labels.data<int32_t>(),
                rows, classes);
  else
    CAST_LAUNCH(ce_forward_kernel<int64_t>, 1, 1024, 0, fptr(loss), fptr(count), fptr(logp), labels.data<int64_t>(),
                rows, classes);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            const Tensor& count, int64_t rows, int64_t classes) {
  if (labels.dtype() == DType::i32)
    CAST_LAUNCH(ce_backward_kernel<int32_t>, blocks_for(rows * classes), kThreads, 0, fptr(dlogits), fptr(dloss),
                fptr(logp), labels.data<int32_t>(), fptr(count), rows, classes);
  else
    CAST_LAUNCH(ce_backward_kernel<int64_t>, blocks_for(rows * classes), kThreads, 0, fptr(dlogits), fptr(dloss),
                fptr(logp), labels.data<int64_t>(), fptr(count), rows, classes);
  CUDA_CHECK_LAUNCH();
}

// One block: each thread finds its rows' top class and compares it with the label.
template <class I>
__global__ void correct_kernel(float* correct, const float* logits, const I* labels, int64_t rows, int64_t classes) {
  float hits = 0;
  for (int64_t r = threadIdx.x; r < rows && classes > 0; r += blockDim.x) {
    const float* row = logits + r * classes;
    int64_t top = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (ranks_before(row[c], c, row[top], top)) top = c;
    hits += labels[r] == top ? 1.f : 0.f;
  }
  hits = block_reduce<false>(hits);
  if (threadIdx.x == 0) correct[0] = hits;
}

void correct_predictions(Tensor& correct, const Tensor& logits, const Tensor& labels, int64_t rows, int64_t classes) {
  if (labels.dtype() == DType::i32)
    CAST_LAUNCH(correct_kernel<int32_t>, 1, 256, 0, fptr(correct), fptr(logits), labels.data<int32_t>(), rows, classes);
  else
    CAST_LAUNCH(correct_kernel<int64_t>, 1, 256, 0, fptr(correct), fptr(logits), labels.data<int64_t>(), rows, classes);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
