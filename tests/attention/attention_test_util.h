#pragma once
// Helpers the attention step tests share (tests/attention/<step>_test.cpp).
#include <functional>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "tests/test_util.h"

namespace cast::testing {

// (B=1, H=2, C=3, κ=2) cluster members, with empty slots and an empty cluster.
inline Tensor sample_members() {
  return Tensor::from_vector<int32_t>({0, 3, 1, -1, -1, -1, 2, 4, 0, 1, 3, -1}, {1, 2, 3, 2});
}

// t on like's device (a constant input of a step that runs where its other inputs are).
inline Tensor on(const Tensor& t, const Tensor& like) { return like.is_cuda() ? t.to(Device::cuda) : t; }

// Values and every gradient of fn(fused) against fn(reference) on the same inputs.
inline void expect_same_op(const std::function<Tensor(const std::vector<Tensor>&, bool)>& fn,
                           std::vector<Tensor> inputs, double rtol, double atol, const std::string& what) {
  Tensor outs[2];
  std::vector<Tensor> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    outs[fused] = fn(inputs, fused == 1);
    Tensor dout = Tensor::uniform(outs[fused].shape(), 77, 0, -1.0, 1.0, outs[fused].dtype());
    autograd::backward(outs[fused], dout);
    for (Tensor& t : inputs) {
      grads[fused].push_back(t.grad());
      t.reset_grad();
    }
  }
  expect_close_per_element(outs[1], outs[0], rtol, atol, what + " output");
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_close_per_element(grads[1][i], grads[0][i], rtol, atol, what + fmt::format(" gradient of input {}", i));
}

}  // namespace cast::testing
