// `cast demo softmax`: one op, softmax with a mask, then layernorm (demo/walk.h).
#include "demo/walk.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/attention/clustering.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::demo {

namespace {

// ================================================================ walk: one op (softmax, layernorm)
void print_tensor(const char* name, const Tensor& t) {
  auto v = t.to_double_vector();
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:+.5f}", i ? " " : "", v[i]);
  fmt::print("  {:<10} {:<16} {}\n", name, shape_str(t.shape()), s);
}

}  // namespace

int walk_softmax() {
  fmt::print("forward: y = softmax(x) over the last axis, the third key masked out\n");
  Tensor x = Tensor::from_vector<double>({0.5, -1.0, 2.0, 0.0, 1.5, 1.5, -0.5, 0.25}, {2, 4});
  x.set_requires_grad();
  Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1}, {1, 4});
  Tensor y = ops::softmax(x, mask);
  print_tensor("x", x);
  print_tensor("y", y);
  fmt::print("backward: dx = y ⊙ (dy − Σ y·dy), with dy = [1, 0, 0, 0] in every row\n");
  Tensor dy = Tensor::from_vector<double>({1, 0, 0, 0, 1, 0, 0, 0}, {2, 4});
  autograd::backward(y, dy);
  print_tensor("dx", x.grad());
  fmt::print("gradient check (f64 central differences, relative error must be <= 1e-6):\n");
  std::vector<Tensor> in = {Tensor::uniform({3, 5}, 1, 0, -1, 1, DType::f64),
                            Tensor::uniform({5}, 2, 0, 0.5, 1.5, DType::f64),
                            Tensor::uniform({5}, 3, 0, -1, 1, DType::f64)};
  for (Tensor& t : in) t.set_requires_grad();
  auto softmax_check = autograd::gradcheck([](const std::vector<Tensor>& v) { return ops::softmax(v[0]); }, {in[0]});
  auto ln_check =
      autograd::gradcheck([](const std::vector<Tensor>& v) { return ops::layernorm(v[0], v[1], v[2]); }, in);
  fmt::print("  softmax:   {} max relative error {:.2e}\n", softmax_check.ok ? "ok  " : "FAIL",
             softmax_check.max_error);
  fmt::print("  layernorm: {} max relative error {:.2e}\n", ln_check.ok ? "ok  " : "FAIL", ln_check.max_error);
  return softmax_check.ok && ln_check.ok ? 0 : 1;
}

}  // namespace cast::demo
