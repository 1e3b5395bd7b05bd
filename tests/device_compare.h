#pragma once
// Layer 2 harness: run the same function on CPU and CUDA copies of the same f32 inputs,
// backpropagate the same output gradient, and compare outputs and every input gradient.
// New tensors start poisoned (tests/test_env.cpp), so unwritten outputs show up as NaN.
#include <functional>
#include <string>
#include <utility>

#include "tests/test_util.h"

namespace cast::testing {

using DeviceFn = std::function<Tensor(const std::vector<Tensor>&)>;

// The random values input i's gradient starts from, on both devices.
inline Tensor prefilled_grad(const Tensor& input, size_t i) {
  return Tensor::uniform(input.shape(), 900 + i, 0, -1.0, 1.0, input.dtype());
}

inline std::vector<Tensor> copy_inputs(const std::vector<Tensor>& inputs, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    Tensor c = t.to(device).clone();
    if (t.requires_grad()) c.set_requires_grad();
    out.push_back(c);
  }
  return out;
}

// Runs fn on CPU copies of the inputs, then backward with a fixed output gradient; then the same
// on CUDA copies. Every input's gradient starts as the same random values on both devices, not
// zeros: a backward must add into its input gradients (the op contract), and one that overwrites
// them would otherwise pass. Each forward is walked by its own backward: one tape holds one device's graph
// at a time (recording both first would leave the second backward nothing to walk). Compares
// outputs, every input gradient and every tensor `extra(device)` names (parameters).
using ExtraFn = std::function<std::vector<std::pair<std::string, Tensor>>(Device)>;

inline void expect_devices_agree(const DeviceFn& fn, const std::vector<Tensor>& inputs, double rtol = 1e-5,
                                 const ExtraFn& extra = nullptr, double atol = 1e-5) {
  struct Run {
    std::vector<Tensor> in;
    Tensor out;
    std::vector<Tensor> grads;
    std::vector<std::pair<std::string, Tensor>> extra;
  } runs[2];
  Tensor dout;
  for (int r = 0; r < 2; ++r) {
    const Device device = r == 0 ? Device::cpu : Device::cuda;
    Run& run = runs[r];
    run.in = copy_inputs(inputs, device);
    for (size_t i = 0; i < run.in.size(); ++i)
      if (run.in[i].requires_grad() && is_float(run.in[i].dtype()))
        run.in[i].set_grad(prefilled_grad(inputs[i], i).to(device));
    run.out = fn(run.in);
    if (r == 0 && is_float(run.out.dtype())) dout = Tensor::uniform(run.out.shape(), 777, 0, -1.0, 1.0);
    if (run.out.requires_grad()) autograd::backward(run.out, dout.to(device));
    autograd::clear_tape();  // a forward that recorded nothing to walk leaves nothing behind
    for (const Tensor& t : run.in) run.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
    if (extra) run.extra = extra(device);
  }
  const Tensor &out_cpu = runs[0].out, &out_gpu = runs[1].out;
  ASSERT_EQ(out_cpu.shape(), out_gpu.shape());
  if (!is_float(out_cpu.dtype())) {
    EXPECT_EQ(max_abs_diff(out_gpu, out_cpu), 0.0) << "integer outputs differ";
    return;
  }
  expect_close_per_element(out_gpu, out_cpu, rtol, atol, "forward output");
  if (!out_cpu.requires_grad()) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    ASSERT_TRUE(runs[0].grads[i].defined() && runs[1].grads[i].defined()) << "input " << i << " got no gradient";
    if (inputs[i].numel() > 0 && out_cpu.numel() > 0)  // an empty output sends no gradient
      EXPECT_GT(max_abs_diff(runs[0].grads[i], prefilled_grad(inputs[i], i)), 0.0)
          << "input " << i << ": the backward added nothing to its gradient";
    expect_close_per_element(runs[1].grads[i], runs[0].grads[i], rtol, atol, fmt::format("gradient of input {}", i));
  }
  ASSERT_EQ(runs[0].extra.size(), runs[1].extra.size());
  for (size_t i = 0; i < runs[0].extra.size(); ++i) {
    const auto& [name, cpu] = runs[0].extra[i];
    const Tensor& gpu = runs[1].extra[i].second;
    ASSERT_TRUE(cpu.defined() && gpu.defined()) << name << " is missing";
    expect_close_per_element(gpu, cpu, rtol, atol, name);
  }
}

inline Tensor rand32(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0, bool grad = true) {
  Tensor t = Tensor::uniform(shape, seed, 0, lo, hi);
  if (grad) t.set_requires_grad();
  return t;
}

}  // namespace cast::testing
