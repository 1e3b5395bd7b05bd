#include "autograd/tape.h"

#include "autograd/trace.h"

namespace cast::autograd {

namespace {
struct Tape {
  std::vector<std::unique_ptr<Node>> nodes;
  bool enabled = true;
};
thread_local Tape tape;
thread_local const TensorImpl* backward_root = nullptr;  // the output backward() started from, while it runs
}  // namespace

bool grad_enabled() { return tape.enabled; }

NoGradGuard::NoGradGuard() : previous_(tape.enabled) { tape.enabled = false; }
NoGradGuard::~NoGradGuard() { tape.enabled = previous_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!tape.enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(std::unique_ptr<Node> node) {
  for (Tensor& out : node->outputs) out.impl()->requires_grad = true;
  node->step = current_step();
  node->fast_path = current_fast_path();
  node->precision = current_precision();
  tape.nodes.push_back(std::move(node));
  if (TapeObserver* observer = tape_observer()) observer->recorded(*tape.nodes.back());
}

SeparateTape::SeparateTape()
    : outer_nodes_(std::move(tape.nodes)),
      outer_enabled_(tape.enabled),
      outer_root_(backward_root),
      outer_observer_(set_tape_observer(nullptr)) {
  tape.nodes.clear();
  tape.enabled = true;
  backward_root = nullptr;
}

SeparateTape::~SeparateTape() {
  tape.nodes = std::move(outer_nodes_);
  tape.enabled = outer_enabled_;
  backward_root = outer_root_;
  set_tape_observer(outer_observer_);
}

size_t tape_size() { return tape.nodes.size(); }
void clear_tape() { tape.nodes.clear(); }

void for_each_node(const std::function<void(const Node&)>& visit) {
  for (const auto& node : tape.nodes) visit(*node);
}

namespace {
// An output held by its node alone can be read by nobody but that node's backward.
void release_unread_outputs(Node& node, const Tensor& root) {
  if (node.backward_reads_outputs()) return;
  for (Tensor& o : node.outputs)
    if (o.impl_ptr().use_count() == 1 && !o.same_as(root)) o.impl()->storage.reset();
}
}  // namespace

void backward(const Tensor& output, const Tensor& output_grad) {
  CAST_CHECK(output.requires_grad(), "backward: the output does not require grad (nothing was recorded)");
  Tensor out = output;
  accumulate(out, output_grad);
  backward_root = out.impl();
  struct Finish {  // also when a backward throws: what is left of the tape goes too
    ~Finish() {
      backward_root = nullptr;
      tape.nodes.clear();
    }
  } finish;
  NoGradGuard no_record;  // backward itself is not recorded
  TapeObserver* observer = tape_observer();
  if (observer) observer->backward_began();
  while (!tape.nodes.empty()) {  // newest first; each node leaves the tape as it runs
    const std::unique_ptr<Node> taken = std::move(tape.nodes.back());
    tape.nodes.pop_back();
    Node& node = *taken;
    bool has_grad = false;
    for (const Tensor& o : node.outputs) has_grad = has_grad || o.grad().defined();
    if (observer) observer->before_backward(node);
    if (has_grad) {
      release_unread_outputs(node, out);
      PrecisionGuard at(node.precision);
      node.backward();
    }
    if (observer) observer->after_backward(node, has_grad);
    // Every consumer of these outputs ran earlier in this reverse walk: their gradients are done,
    // and so is this node: what it saved for its backward goes now, not at the end of the walk.
    for (Tensor& o : node.outputs)
      if (!o.same_as(output)) o.reset_grad();
  }
  if (observer) observer->backward_ended();
}

void backward(const Tensor& loss) {
  CAST_CHECK(loss.numel() == 1, "backward: loss must have one element, got {}", loss.describe());
  backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), loss.device()));
}

static GradientAdd gradient_add = nullptr;

void set_gradient_add(GradientAdd add) { gradient_add = add; }

void accumulate(Tensor& t, const Tensor& g) {
  CAST_CHECK(g.shape() == t.shape(), "autograd: gradient {} does not match tensor {}", g.describe(), t.describe());
  CAST_CHECK(g.dtype() == t.dtype() && g.device() == t.device(), "autograd: gradient {} does not match tensor {}",
             g.describe(), t.describe());
  if (!t.grad().defined()) {
    t.set_grad(g.clone());
    return;
  }
  CAST_CHECK(gradient_add != nullptr, "autograd: no gradient add installed (ops/elementwise.cpp installs it)");
  gradient_add(t.grad(), g);
}

bool pass_gradient(Tensor& t, const Tensor& output) {
  const std::shared_ptr<TensorImpl>& g = output.impl()->grad;
  CAST_CHECK(g != nullptr, "autograd: {} has no gradient to pass on", output.describe());
  const bool released = output.impl() != backward_root;  // backward() frees it once its node has run
  if (!released || t.grad().defined() || g.use_count() != 1 || g->storage.use_count() != 1) return false;
  t.set_grad(output.grad().view(t.shape()));  // the buffer changes hands: nobody else can see it
  return true;
}

void accumulate_reshaped(Tensor& t, const Tensor& output) {
  if (!pass_gradient(t, output)) accumulate(t, output.grad().view(t.shape()));
}

}  // namespace cast::autograd
