#pragma once
// Layer 2 harness: run the same function on CPU and CUDA copies of the same f32 inputs,
// backpropagate the same output gradient, and compare outputs and every input gradient.
// New tensors start poisoned (tests/test_env.cpp), so unwritten outputs show up as NaN.
#include "tests/test_util.h"

namespace cast::testing {

using DeviceFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline std::vector<Tensor> copy_inputs(const std::vector<Tensor>& inputs, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor c = t.to(device).clone();
    if (t.requires_grad()) c.set_requires_grad();
    out.push_back(c);
  }
  return out;
}

// Relative tolerance ‖cuda − cpu‖/‖cpu‖ (ATTENTION.md: 1e-5 in fp32).
inline void expect_devices_agree(const DeviceFn& fn, const std::vector<Tensor>& inputs, double tol = 1e-5) {
  std::vector<Tensor> cpu = copy_inputs(inputs, Device::cpu), gpu = copy_inputs(inputs, Device::cuda);
  Tensor out_cpu = fn(cpu);
  Tensor out_gpu = fn(gpu);
  ASSERT_EQ(out_cpu.shape(), out_gpu.shape());
  if (!is_float(out_cpu.dtype())) {
    EXPECT_EQ(max_abs_diff(out_gpu, out_cpu), 0.0) << "integer outputs differ";
    return;
  }
  EXPECT_LT(rel_diff(out_gpu, out_cpu), tol) << "forward outputs differ";
  if (!out_cpu.requires_grad()) return;
  Tensor dout = Tensor::uniform(out_cpu.shape(), 777, 0, -1.0, 1.0);
  autograd::backward(out_cpu, dout);
  autograd::backward(out_gpu, dout.to(Device::cuda));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    ASSERT_TRUE(cpu[i].grad().defined() && gpu[i].grad().defined()) << "input " << i << " got no gradient";
    EXPECT_LT(rel_diff(gpu[i].grad(), cpu[i].grad()), tol) << "gradient of input " << i << " differs";
  }
}

inline Tensor rand32(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0, bool grad = true) {
  Tensor t = Tensor::uniform(shape, seed, 0, lo, hi);
  if (grad) t.set_requires_grad();
  return t;
}

}  // namespace cast::testing
