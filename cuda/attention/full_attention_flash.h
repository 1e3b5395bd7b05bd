#pragma once
#include <string>
#include <vector>

#include "tensor/precision.h"
#include "tensor/tensor.h"

namespace cast::cuda {
// The kernels that run flash attention's tile products:
//   fma     FP32 FMA units (cuda/attention/full_attention_flash.cu)
//   tf32x3  tensor cores, each FP32 operand as a TF32 high part and a TF32 remainder, three
//           products (cuda/attention/full_attention_flash_tensor_core.cu): about FP32's accuracy
//   tf32    tensor cores, TF32 operands
//   bf16    tensor cores, BF16 operands
// All accumulate in FP32 and keep the softmax statistics in FP32.
enum class FlashKernel : uint8_t { fma, tf32x3, tf32, bf16 };
const char* flash_kernel_name(FlashKernel kernel);
// "fma", "tf32x3", "tf32" or "bf16"; throws a UsageError otherwise.
FlashKernel parse_flash_kernel(const std::string& name);
// The kernel a precision runs: fp32 → kFp32FlashKernel, tf32 → tf32, bf16 → bf16.
FlashKernel flash_kernel_for(Precision precision);
// What `--precision fp32` runs by default: the split TF32 kernel, which measured below the FMA
// kernel's error against f64 on every output and gradient (on an H200 at width 32; in the
// emulation, with every sum apart, at widths 32 and 64) and faster at every length and width up
// to 64 (bench/RESULTS.md; beyond 64, and where d % 4 ≠ 0, the FMA kernel runs).
// `cast bench --fp32-flash fma` sets the other for one benchmark, so that both can be timed.
constexpr FlashKernel kFp32FlashKernel = FlashKernel::tf32x3;
void set_fp32_flash_kernel(FlashKernel kernel);  // fma or tf32x3

// Full attention without an M×N matrix (ops/attention/full_attention_flash.h): q (B, H, M, d), k and v
// (B, H, N, d), mask (B, N) f32 or undefined; d at most 128. The TF32 kernels need d % 4 == 0
// and 16-byte aligned rows, and tf32x3 d ≤ 64; where they do not hold, the FMA kernels run instead.
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask, FlashKernel kernel = FlashKernel::fma);
// Adds into each given gradient (dq, dk, dv may be null). `kernel` as the forward's.
void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& mask, const Tensor& out, const Tensor& lse,
                              FlashKernel kernel = FlashKernel::fma);
// The kernel that runs for these operands (and the backward's dout): `kernel`, or fma where a
// TF32 kernel cannot take them or the kernel's tiles do not fit the GPU's shared memory.
FlashKernel flash_kernel_that_runs(FlashKernel kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& dout = Tensor());

// The tensor-core kernels (cuda/attention/full_attention_flash_tensor_core.cu); delta: Δ = rowsum(dO ⊙ O), (B, H, M).
void flash_tc_forward(FlashKernel kernel, Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& mask);
void flash_tc_backward(FlashKernel kernel, Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& lse, const Tensor& delta);

// How each compiled flash kernel is launched (threads per block, dynamic shared memory), for
// `cast info --kernels` and scripts/kernel_report.sh's occupancy column: ptxas reports registers
// and static shared memory but cannot know a launch's dynamic shared memory.
struct KernelLaunchShape {
  std::string kernel;  // as ptxas's demangled name, less namespaces and parameters
  int threads;
  size_t dynamic_shared_bytes;
};
std::vector<KernelLaunchShape> flash_launch_shapes();  // the FMA and the tensor-core kernels
std::vector<KernelLaunchShape> flash_tc_launch_shapes();

// The tensor-core kernels' streamed tile (keys, or queries in dK/dV): 0 each kernel's default
// (cuda/attention/full_attention_flash_tensor_core.cu), or 32, 64 or 128 rows for `cast bench flash --stream-rows`; and
// the rows that run for a kernel at head width d.
void set_flash_stream_rows(int rows);
int flash_stream_rows(FlashKernel kernel, int d, bool forward);
// Rows per warp of the forward and the backward: 16 (a block owns 64 rows) or 32 (128 rows, each
// fragment read from shared memory feeding two products; not where the registers would spill:
// 128-row streamed tiles, and in the backward width 128, width 64 with 64 streamed rows, and
// tf32x3 at width 64, or at width 32 with 64 streamed rows); 0 each kernel's defaults. `cast bench flash --warp-rows`; flash_warp_rows and
// flash_backward_warp_rows: the rows that run.
void set_flash_warp_rows(int rows);
// The buffers of the split kernel's streamed tiles in its backward at width 64: 2 (the copy of the
// next tile runs while one is multiplied) or 1 (the streamed tiles' shared memory halved: 132 →
// 99 KiB, two blocks on an SM instead of one); 0 the defaults. Every other tile keeps 2. `cast bench
// flash --copy-stages`; flash_copy_stages: what runs (2 for every other kernel).
void set_flash_copy_stages(int stages);
int flash_copy_stages(FlashKernel kernel, int d, bool forward);
// Whether the tiles a tensor-core kernel would run at head width d, forward and backward, fit this
// GPU's shared memory per block (else flash_kernel_that_runs gives fma). Tests lower the limit
// with set_flash_shared_limit (0: the device's).
bool flash_tc_fits(FlashKernel kernel, int d);
void set_flash_shared_limit(size_t bytes);
// The most batch-heads one launch of a flash kernel covers (a grid's y extent, 65535 on a GPU):
// more go in several launches. Tests lower it, so that small shapes run several launches.
void set_flash_grid_y_limit(int64_t limit);
// The tensor-core backward: `split`, two kernels (dQ, then dK and dV, each forming the scores and
// dP: 7 tile products), or `fused`, one (dK and dV, with dQ's partials added in turn: 5 products,
// the same sums at every run), or `fused_atomic`, the same kernel adding dQ's partials by atomic
// adds (FlashAttention-2's way: no waits, but dq's last bits may change from run to run).
// `cast bench flash --flash-backward split,fused,fused-atomic` times them; the engine runs split,
// which measured 1.6 to 3.6 times faster than fused on an H100 (bench/RESULTS.md).
enum class FlashBackward : uint8_t { split, fused, fused_atomic };
void set_flash_backward(FlashBackward backward);
FlashBackward flash_backward();
const char* flash_backward_name(FlashBackward backward);
// Whether the fused kernel runs for this kernel at head width d (fused or fused_atomic set, and the
// tile it would take compiled and within shared memory; else the split pair runs).
bool flash_backward_runs_fused(FlashKernel kernel, int d);
// "split", "fused" or "fused-atomic"; a UsageError otherwise
FlashBackward parse_flash_backward(const std::string& name);
int flash_warp_rows(FlashKernel kernel, int d);
int flash_backward_warp_rows(FlashKernel kernel, int d);
}  // namespace cast::cuda
