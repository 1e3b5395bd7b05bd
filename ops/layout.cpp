#include "ops/layout.h"

#include <cstring>
#include <memory>
#include <numeric>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/reduce.h"
#ifdef CAST_WITH_CUDA
#include "cuda/layout.h"
#endif

namespace cast::ops {

// ---------------------------------------------------------------- reshape
struct ReshapeNode final : autograd::Node {
  Tensor x;  // input; the gradient is viewed back to its shape
  const char* name() const override { return "reshape"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override { autograd::accumulate_reshaped(x, outputs[0]); }
};

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = x.view(shape);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<ReshapeNode>();
    node->x = x;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

// ---------------------------------------------------------------- permute
PermuteIndex make_permute_index(const Shape& in, const std::vector<int>& perm) {
  const int nd = static_cast<int>(in.size());
  CAST_CHECK(static_cast<int>(perm.size()) == nd, "permute: {} axes given for a {}-dim tensor", perm.size(), nd);
  CAST_CHECK(nd <= kMaxDims, "permute: at most {} dims", kMaxDims);
  std::vector<int64_t> stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * in[d + 1];
  std::vector<bool> seen(nd, false);
  PermuteIndex idx;
  idx.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    int a = perm[d];
    CAST_CHECK(a >= 0 && a < nd && !seen[a], "permute: {} is not a permutation of {} axes",
               shape_str(Shape(perm.begin(), perm.end())), nd);
    seen[a] = true;
    idx.out_shape[d] = in[a];
    idx.in_stride[d] = stride[a];
  }
  return idx;
}

static Shape permuted_shape(const Shape& in, const std::vector<int>& perm) {
  Shape out(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) out[d] = in[perm[d]];
  return out;
}

void permute_forward(Tensor& y, const Tensor& x, const std::vector<int>& perm, bool accumulate) {
  PermuteIndex idx = make_permute_index(x.shape(), perm);
  CAST_CHECK(y.shape() == permuted_shape(x.shape(), perm), "permute: output {} does not match", y.describe());
  check_same_dtype("permute", x, y);
  CAST_ON_CUDA(x, cuda::permute(y, x, idx, accumulate));
  CAST_DISPATCH_FLOAT(x.dtype(), "permute", [&] {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    // One output row (the last output dim) at a time: its start in the input is computed once,
    // then the row is read at a fixed stride (1 when the last axis stays last: a plain copy).
    const int64_t len = idx.ndim ? idx.out_shape[idx.ndim - 1] : 1;
    const int64_t step = idx.ndim ? idx.in_stride[idx.ndim - 1] : 1;
    const int64_t rows = len ? n / len : 0;
    CAST_OMP("omp parallel for if (n > 65536)")
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = px + idx.input_offset(r * len);
      T* dst = py + r * len;
      if (accumulate)
        for (int64_t j = 0; j < len; ++j) dst[j] += src[j * step];
      else
        for (int64_t j = 0; j < len; ++j) dst[j] = src[j * step];
    }
  });
}

static std::vector<int> inverse_perm(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) inv[perm[d]] = static_cast<int>(d);
  return inv;
}

void permute_backward(Tensor& dx, const Tensor& dy, const std::vector<int>& perm, bool accumulate) {
  permute_forward(dx, dy, inverse_perm(perm), accumulate);
}

struct PermuteNode final : autograd::Node {
  std::vector<int> perm;
  Tensor x;
  const char* name() const override { return "permute"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    bool fresh = false;  // a first gradient is written, not added to zeros
    Tensor dx = x.grad_buffer(&fresh);
    permute_backward(dx, outputs[0].grad(), perm, /*accumulate=*/!fresh);
  }
};

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  check_float("permute", x, "x");
  make_permute_index(x.shape(), perm);  // validates
  Tensor y = Tensor::empty(permuted_shape(x.shape(), perm), x.dtype(), x.device());
  permute_forward(y, x, perm);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<PermuteNode>();
    node->perm = perm;
    node->x = x;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

Tensor transpose(const Tensor& x, int axis0, int axis1) {
  std::vector<int> perm(x.ndim());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[normalize_axis("transpose", axis0, x.ndim())], perm[normalize_axis("transpose", axis1, x.ndim())]);
  return permute(x, perm);
}

// ---------------------------------------------------------------- concat / split
void copy_rows(Tensor& dst, const Tensor& src, const RowBlock& b, bool accumulate) {
  check_same_dtype("copy_rows", dst, src);
  check_same_device("copy_rows", dst, src);
  CAST_ON_CUDA(dst, cuda::copy_rows(dst, src, b.rows, b.row_len, b.dst_offset, b.dst_stride, b.src_offset, b.src_stride,
                                    accumulate));
  CAST_DISPATCH_FLOAT(dst.dtype(), "copy_rows", [&] {
    const T* ps = src.data<T>();
    T* pd = dst.data<T>();
    for (int64_t r = 0; r < b.rows; ++r) {
      const T* s = ps + b.src_offset + r * b.src_stride;
      T* d = pd + b.dst_offset + r * b.dst_stride;
      if (accumulate)
        for (int64_t j = 0; j < b.row_len; ++j) d[j] += s[j];
      else std::memcpy(d, s, sizeof(T) * b.row_len);
    }
  });
}

// Piece k of `whole` along `axis` starts at `start` and has length n_k: one RowBlock per piece.
static RowBlock piece_block(const Shape& whole, int axis, int64_t start, int64_t len) {
  AxisSplit p = split_at_axis(whole, axis);
  RowBlock b;
  b.rows = p.outer;
  b.row_len = len * p.inner;
  b.dst_offset = start * p.inner;
  b.dst_stride = p.n * p.inner;
  b.src_offset = 0;
  b.src_stride = len * p.inner;
  return b;
}

static RowBlock swapped(RowBlock b) {
  std::swap(b.dst_offset, b.src_offset);
  std::swap(b.dst_stride, b.src_stride);
  return b;
}

void concat_forward(Tensor& y, const std::vector<Tensor>& xs, int axis) {
  int64_t start = 0;
  for (const Tensor& x : xs) {
    copy_rows(y, x, piece_block(y.shape(), axis, start, x.shape()[axis]), false);
    start += x.shape()[axis];
  }
}

// dxs[k] (may be null: not wanted) += the slice of dy that xs[k] filled.
void concat_backward(const std::vector<Tensor*>& dxs, const std::vector<Tensor>& xs, const Tensor& dy, int axis) {
  int64_t start = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    int64_t len = xs[k].shape()[axis];
    if (dxs[k]) copy_rows(*dxs[k], dy, swapped(piece_block(dy.shape(), axis, start, len)), true);
    start += len;
  }
}

struct ConcatNode final : autograd::Node {
  int axis = 0;
  std::vector<Tensor> xs;  // inputs; only their shapes and gradients are used
  const char* name() const override { return "concat"; }
  void fields(autograd::FieldVisitor& visit) const override {
    for (const Tensor& x : xs) visit.input("x", x);
  }
  void backward() override {
    std::vector<Tensor> grads(xs.size());
    std::vector<Tensor*> dxs(xs.size(), nullptr);
    for (size_t k = 0; k < xs.size(); ++k)
      if (xs[k].requires_grad()) {
        grads[k] = xs[k].grad_accumulator();
        dxs[k] = &grads[k];
      }
    concat_backward(dxs, xs, outputs[0].grad(), axis);
  }
};

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  CAST_CHECK(!xs.empty(), "concat: no tensors given");
  check_float("concat", xs[0], "xs[0]");
  axis = normalize_axis("concat", axis, xs[0].ndim());
  Shape shape = xs[0].shape();
  shape[axis] = 0;
  bool wants_grad = false;
  for (const Tensor& x : xs) {
    check_same_dtype("concat", xs[0], x);
    check_same_device("concat", xs[0], x);
    Shape s = x.shape();
    CAST_CHECK(s.size() == shape.size(), "concat: {} and {} differ in rank", xs[0].describe(), x.describe());
    for (size_t d = 0; d < s.size(); ++d)
      CAST_CHECK(static_cast<int>(d) == axis || s[d] == shape[d], "concat: {} and {} differ off axis {}",
                 xs[0].describe(), x.describe(), axis);
    shape[axis] += s[axis];
    wants_grad = wants_grad || autograd::needs_grad({&x});
  }
  Tensor y = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
  concat_forward(y, xs, axis);
  if (wants_grad) {
    auto node = std::make_unique<ConcatNode>();
    node->axis = axis;
    node->xs = xs;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

struct SplitNode final : autograd::Node {
  int axis = 0;
  Tensor x;  // input; piece k's gradient lands in its slice of x's gradient
  const char* name() const override { return "split"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    int64_t start = 0;
    for (Tensor& piece : outputs) {
      int64_t len = piece.shape()[axis];
      if (piece.grad().defined()) copy_rows(dx, piece.grad(), piece_block(x.shape(), axis, start, len), true);
      start += len;
    }
  }
};

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int axis) {
  check_float("split", x, "x");
  axis = normalize_axis("split", axis, x.ndim());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  CAST_CHECK(total == x.shape()[axis], "split: sizes add up to {}, but axis {} of {} has {}", total, axis, x.describe(),
             x.shape()[axis]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t len : sizes) {
    Shape s = x.shape();
    s[axis] = len;
    Tensor piece = Tensor::empty(s, x.dtype(), x.device());
    copy_rows(piece, x, swapped(piece_block(x.shape(), axis, start, len)), false);
    pieces.push_back(piece);
    start += len;
  }
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<SplitNode>();
    node->axis = axis;
    node->x = x;
    node->outputs = pieces;
    autograd::record(std::move(node));
  }
  return pieces;
}

}  // namespace cast::ops
