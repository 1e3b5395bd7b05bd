#pragma once
// One warp running one tensor-core instruction on given matrices (cuda/tensor_core_check.cu),
// for tests/test_tensor_core.cpp. All tensors on the device.
#include "tensor/tensor.h"

namespace cast::cuda {
// d = a b + c through one mma.sync: a (16, k) f32, b (k, 8) f32, c and d (16, 8) f32; k = 8 runs
// m16n8k8 on TF32 operands (cvt.rna of a and b), k = 16 runs m16n8k16 on BF16 operands.
void mma_check(Tensor& d, const Tensor& a, const Tensor& b, const Tensor& c);
// One ldmatrix .x4 (.trans where asked) over four 8×8 matrices of 16-bit elements: in (32·8 / 2)
// i32 words holding 32 rows of 8 elements, out (32·4) i32: register m of lane l at 4l + m.
void ldmatrix_check(Tensor& out, const Tensor& in, bool trans);
// Two cp.async groups per lane of 16 bytes (4 f32) each, where valid[lane] != 0, zeros elsewhere:
// out (2·32·4) f32 should be src twice with the invalid chunks zero, the first half read after
// cp.async.wait_group 1, the second after wait_group 0.
void cp_async_check(Tensor& out, const Tensor& src, const Tensor& valid);
// The device's conversions of x (f32): TF32 bits (cvt.rna) and BF16 bits, each as i32.
void round_check(Tensor& tf32, Tensor& bf16, const Tensor& x);
}  // namespace cast::cuda
