// Cross-entropy from log-probabilities (computed by the softmax kernel).
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/loss.h"

namespace cast::cuda {

// One block: the mean of −logp[r, label[r]] over labelled rows, and their count.
template <class I>
__global__ void ce_forward_kernel(float* loss, float* count_out, const float* logp, const I* labels, int64_t rows,
                                  int64_t classes) {
  float total = 0, count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t y = labels[r];
    if (y < 0) continue;
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
                                   int64_t rows, int64_t classes, float inv_count) {
  CAST_KERNEL_LOOP(e, rows * classes) {
    const int64_t r = e / classes, c = e % classes;
    const int64_t y = labels[r];
    if (y < 0) continue;
    dlogits[e] += dloss[0] * inv_count * (expf(logp[e]) - (c == y ? 1.f : 0.f));
  }
}

int64_t cross_entropy_forward(Tensor& loss, const Tensor& logp, const Tensor& labels, int64_t rows, int64_t classes) {
  Tensor count = Tensor::empty({1}, DType::f32, Device::cuda);
  if (labels.dtype() == DType::i32)
    CAST_LAUNCH(ce_forward_kernel<int32_t>, 1, 1024, 0, fptr(loss), fptr(count), fptr(logp), labels.data<int32_t>(), rows, classes);
  else
    CAST_LAUNCH(ce_forward_kernel<int64_t>, 1, 1024, 0, fptr(loss), fptr(count), fptr(logp), labels.data<int64_t>(), rows, classes);
  CUDA_CHECK_LAUNCH();
  return static_cast<int64_t>(count.item());
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            int64_t rows, int64_t classes, int64_t count) {
  const float inv = 1.f / static_cast<float>(count);
  if (labels.dtype() == DType::i32)
    CAST_LAUNCH(ce_backward_kernel<int32_t>, blocks_for(rows * classes), kThreads, 0, fptr(dlogits), fptr(dloss), fptr(logp),
                                                                 labels.data<int32_t>(), rows, classes, inv);
  else
    CAST_LAUNCH(ce_backward_kernel<int64_t>, blocks_for(rows * classes), kThreads, 0, fptr(dlogits), fptr(dloss), fptr(logp),
                                                                 labels.data<int64_t>(), rows, classes, inv);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
