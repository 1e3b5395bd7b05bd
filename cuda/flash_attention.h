#pragma once
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cast::cuda {
// Full attention without an M×N matrix (ops/flash_attention.h): q (B, H, M, d), k and v
// (B, H, N, d), mask (B, N) f32 or undefined; d at most 128.
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask);
// Adds into each given gradient (dq, dk, dv may be null).
void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& mask, const Tensor& out, const Tensor& lse);

// How each compiled flash kernel is launched (threads per block, dynamic shared memory), for
// `cast info --kernels` and scripts/kernel_report.sh's occupancy column: ptxas reports registers
// and static shared memory but cannot know a launch's dynamic shared memory.
struct KernelLaunchShape {
  std::string kernel;  // as ptxas's demangled name, less namespaces and parameters
  int threads;
  size_t dynamic_shared_bytes;
};
std::vector<KernelLaunchShape> flash_launch_shapes();
}  // namespace cast::cuda
