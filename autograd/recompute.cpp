#include "autograd/recompute.h"

#include <memory>

#include "autograd/tape.h"
#include "tensor/error.h"

namespace cast::autograd {

Tensor leaf_over(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return t;
  Tensor leaf = t.view(t.shape());
  leaf.set_requires_grad();
  return leaf;
}

void take_gradient(Tensor& t, const Tensor& leaf) {
  if (!t.defined() || !t.requires_grad() || !leaf.grad().defined()) return;
  if (!t.grad().defined()) t.set_grad(leaf.grad());
  else accumulate(t, leaf.grad());
}

namespace {

struct RecomputedNode final : Node {
  const char* label = "recomputed";
  Tensor x;  // the input, all this node keeps
  std::function<Tensor(const Tensor&)> body;
  const char* name() const override { return label; }
  // The body formed again gives its own output; this node's is not read.
  bool backward_reads_outputs() const override { return false; }
  void fields(FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    const Tensor dout = outputs[0].grad();
    SeparateTape own;
    const Tensor lx = leaf_over(x);
    const Tensor out = body(lx);
    CAST_CHECK(out.shape() == dout.shape(), "{}: the body formed again gives {}, not the forward's {}", label,
               out.describe(), dout.describe());
    if (!out.requires_grad()) return;  // nothing that needs a gradient reaches the output
    autograd::backward(out, dout);
    take_gradient(x, lx);
  }
};

}  // namespace

Tensor recompute_in_backward(const char* name, const Tensor& x, const Tensor& out,
                             const std::vector<const Tensor*>& parameters, std::function<Tensor(const Tensor&)> body) {
  bool needs = x.requires_grad();
  for (const Tensor* p : parameters) needs = needs || p->requires_grad();
  if (!grad_enabled() || !needs) return out;
  auto node = std::make_unique<RecomputedNode>();
  node->label = name;
  node->x = x;
  node->body = std::move(body);
  node->outputs = {out};
  record(std::move(node));
  return out;
}

}  // namespace cast::autograd
