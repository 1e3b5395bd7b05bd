#pragma once
// The tape: a thread-local list of nodes in execution order. backward() walks it once in
// reverse (a loop, not recursion, so deep graphs cannot overflow the stack), then clears it.
//
// A node is a struct per op with its saved tensors as named fields and a backward() that
// ADDS into the gradients of its inputs. Outputs keep their gradient in tensor.grad().
// Each node also lists those fields by name (fields()), so that tools can show what the tape
// holds: `--trace` (train/trace.h) and the tests that count the tape's bytes.
#include <functional>
#include <memory>
#include <vector>

#include "tensor/precision.h"
#include "tensor/tensor.h"

namespace cast::autograd {

class TapeObserver;  // autograd/trace.h

// Receives a node's tensor fields by name. An undefined tensor (an optional input that was not
// given) is passed too; visitors skip it.
class FieldVisitor {
 public:
  virtual void input(const char* name, const Tensor& t) = 0;  // an argument of the op, kept for backward
  virtual void saved(const char* name, const Tensor& t) = 0;  // computed by the forward for the backward

 protected:
  ~FieldVisitor() = default;
};

struct Node {
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  virtual void backward() = 0;
  virtual void fields(FieldVisitor& visit) const = 0;  // every tensor field, in declaration order
  // False for a backward that reads its outputs' gradients only, never their values. backward()
  // then releases the values of an output nothing else holds before this node's backward runs,
  // so they are not alive beside the gradients that backward forms.
  virtual bool backward_reads_outputs() const { return true; }
  std::vector<Tensor> outputs;  // released (their gradients freed) once this node has run
  // Stamped by record() from the scopes of autograd/trace.h: the step of docs/attention.md the
  // node belongs to, and the fast path (ops/attention/fast_paths.h) that ran it; nullptr: none, the reference.
  const char* step = nullptr;
  const char* fast_path = nullptr;
  // Stamped by record(): the precision of the forward's products (tensor/precision.h), which
  // backward() runs this node's backward at, so the two never disagree.
  Precision precision = Precision::fp32;
};

bool grad_enabled();

// Disables recording in a scope (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when recording is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// Marks `outputs` as requiring grad and appends the node to the tape.
void record(std::unique_ptr<Node> node);

// Seeds d(loss)/d(loss) = 1 (loss must have one element), runs every node in reverse, clears the tape.
// Each node is freed, with what it saved, as soon as its backward has run.
void backward(const Tensor& loss);
// Same with an explicit output gradient of loss's shape.
void backward(const Tensor& output, const Tensor& output_grad);

// A tape of this thread's own for a scope: the nodes recorded in it, and a backward() run in it,
// leave the tape outside as it was, and recording is on in it whatever it was outside. A node
// whose backward forms its forward again (ops/attention/cast_attention_recompute.cpp, a block
// under --recompute: autograd/recompute.h) records that forward here and walks it back. A trace sees the op as one node: the observer is away meanwhile.
class SeparateTape {
 public:
  SeparateTape();
  ~SeparateTape();
  SeparateTape(const SeparateTape&) = delete;
  SeparateTape& operator=(const SeparateTape&) = delete;

 private:
  std::vector<std::unique_ptr<Node>> outer_nodes_;
  bool outer_enabled_;
  const TensorImpl* outer_root_;
  TapeObserver* outer_observer_;
};

size_t tape_size();
void clear_tape();
// Every node on the tape, oldest first.
void for_each_node(const std::function<void(const Node&)>& visit);

// Adds `g` into t's gradient buffer, checking the shape (the accumulation contract).
void accumulate(Tensor& t, const Tensor& g);
// The kernel that accumulation adds with (acc += g on either device). Autograd sits below the
// ops and knows no kernels: ops/elementwise.cpp installs its add_into here before main runs.
using GradientAdd = void (*)(Tensor acc, const Tensor& g);
void set_gradient_add(GradientAdd add);

// Hands the gradient buffer of `output` to t, viewed to t's shape, as t's gradient, with no copy:
// backward() releases an output's gradient once its node has run, so when t has no gradient yet
// and nothing else holds that buffer (not the caller of backward(), whose output keeps its
// gradient, nor a view), the buffer can change hands. Returns false, changing nothing, otherwise.
// The caller holds no copy of output.grad() while it asks.
bool pass_gradient(Tensor& t, const Tensor& output);
// Adds the gradient of `output`, viewed to t's shape, into t's gradient (taking the buffer over
// where pass_gradient can): the backward of a node whose output is its input reshaped.
void accumulate_reshaped(Tensor& t, const Tensor& output);

}  // namespace cast::autograd
