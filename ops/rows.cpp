#include "ops/rows.h"

#include <cstring>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#ifdef CAST_WITH_CUDA
#include "cuda/rows.h"
#endif

namespace cast::ops {

void check_index_range(const char* op, const Tensor& idx, int64_t lo, int64_t hi) {
  check_index(op, idx, "index");
  if (idx.numel() == 0) return;
  CAST_ON_CUDA(idx, cuda::check_index_range_later(op, idx, lo, hi));  // raised at the next wait: no round trip
  int64_t mn = 0, mx = 0;
  CAST_DISPATCH_INDEX(idx.dtype(), op, [&] {
    const I* p = idx.data<I>();
    mn = mx = p[0];
    for (int64_t i = 1; i < idx.numel(); ++i) {
      mn = std::min<int64_t>(mn, p[i]);
      mx = std::max<int64_t>(mx, p[i]);
    }
  });
  CAST_CHECK(mn >= lo && mx < hi, "{}: index out of range: values span [{}, {}], allowed [{}, {})", op, mn, mx, lo, hi);
}

struct RowsShape {
  int64_t b, n, m, d;
};
static RowsShape check_rows(const char* op, const Tensor& x, const Tensor& idx, const Tensor& out) {
  check_float(op, x, "x");
  check_index(op, idx, "idx");
  check_same_device(op, x, idx);
  check_ndim(op, x, 3, "x");
  check_ndim(op, idx, 2, "idx");
  RowsShape s{x.dim(0), x.dim(1), idx.dim(1), x.dim(2)};
  CAST_CHECK(idx.dim(0) == s.b, "{}: idx {} and x {} differ in batch", op, idx.describe(), x.describe());
  CAST_CHECK(out.shape() == (Shape{s.b, s.m, s.d}), "{}: rows tensor {} must be [{}, {}, {}]", op, out.describe(), s.b,
             s.m, s.d);
  return s;
}

void gather_rows_forward(Tensor& out, const Tensor& x, const Tensor& idx, bool accumulate) {
  RowsShape s = check_rows("gather_rows", x, idx, out);
  CAST_ON_CUDA(x, cuda::gather_rows(out, x, idx, s.b, s.n, s.m, s.d, accumulate));
  CAST_DISPATCH_FLOAT(x.dtype(), "gather_rows", [&] {
    CAST_DISPATCH_INDEX(idx.dtype(), "gather_rows", [&] {
      const I* pi = idx.data<I>();
      CAST_OMP("omp parallel for if (s.b * s.m * s.d > 65536)")
      for (int64_t r = 0; r < s.b * s.m; ++r) {
        const int64_t b = r / s.m, src = pi[r];
        T* o = out.data<T>() + r * s.d;
        const T* xr = x.data<T>() + (b * s.n + src) * s.d;
        for (int64_t j = 0; j < s.d; ++j) o[j] = (accumulate ? o[j] : T(0)) + (src >= 0 ? xr[j] : T(0));
      }
    });
  });
}

void gather_rows_backward(Tensor& dx, const Tensor& dout, const Tensor& idx) {
  RowsShape s = check_rows("scatter_add_rows", dx, idx, dout);
  CAST_ON_CUDA(dx, cuda::scatter_add_rows(dx, dout, idx, s.b, s.n, s.m, s.d));
  CAST_DISPATCH_FLOAT(dx.dtype(), "scatter_add_rows", [&] {
    CAST_DISPATCH_INDEX(idx.dtype(), "scatter_add_rows", [&] {
      const I* pi = idx.data<I>();
      CAST_OMP("omp parallel for if (s.b > 1 && s.m * s.d > 4096)")
      for (int64_t b = 0; b < s.b; ++b)  // batches write disjoint rows; within one, serial
        for (int64_t p = 0; p < s.m; ++p) {
          const int64_t dst = pi[b * s.m + p];
          if (dst < 0) continue;
          const T* g = dout.data<T>() + (b * s.m + p) * s.d;
          T* o = dx.data<T>() + (b * s.n + dst) * s.d;
          for (int64_t j = 0; j < s.d; ++j) o[j] += g[j];
        }
    });
  });
}

struct GatherRowsNode final : autograd::Node {
  Tensor x;    // input: (B, N, D), receives the scattered gradient
  Tensor idx;  // (B, M), a constant of the backward pass
  const char* name() const override { return "gather_rows"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("idx", idx);
  }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    gather_rows_backward(dx, outputs[0].grad(), idx);
  }
};

Tensor gather_rows(const Tensor& x, const Tensor& idx) {
  check_ndim("gather_rows", x, 3, "x");
  check_ndim("gather_rows", idx, 2, "idx");
  check_index_range("gather_rows", idx, -1, x.dim(1));
  Tensor out = Tensor::empty({x.dim(0), idx.dim(1), x.dim(2)}, x.dtype(), x.device());
  gather_rows_forward(out, x, idx);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<GatherRowsNode>();
    node->x = x;
    node->idx = idx;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

struct ScatterAddRowsNode final : autograd::Node {
  Tensor src;  // input: (B, M, D)
  Tensor idx;  // (B, M)
  const char* name() const override { return "scatter_add_rows"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("src", src);
    visit.input("idx", idx);
  }
  void backward() override {
    Tensor dsrc = src.grad_accumulator();
    gather_rows_forward(dsrc, outputs[0].grad(), idx, /*accumulate=*/true);
  }
};

Tensor scatter_add_rows(const Tensor& src, const Tensor& idx, int64_t n) {
  check_ndim("scatter_add_rows", src, 3, "src");
  check_index_range("scatter_add_rows", idx, -1, n);
  Tensor out = Tensor::zeros({src.dim(0), n, src.dim(2)}, src.dtype(), src.device());
  gather_rows_backward(out, src, idx);
  if (autograd::needs_grad({&src})) {
    auto node = std::make_unique<ScatterAddRowsNode>();
    node->src = src;
    node->idx = idx;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// An embedding lookup is a gather from a batch of one table.
struct EmbeddingNode final : autograd::Node {
  Tensor table;  // (V, D)
  Tensor idx;    // any shape, flattened to (1, M) for the row kernels
  const char* name() const override { return "embedding"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("table", table);
    visit.input("idx", idx);
  }
  void backward() override {
    Tensor dtable = table.grad_accumulator().view({1, table.dim(0), table.dim(1)});
    gather_rows_backward(dtable, outputs[0].grad().view({1, idx.numel(), table.dim(1)}), idx.view({1, -1}));
  }
};

Tensor embedding(const Tensor& table, const Tensor& idx) {
  check_float("embedding", table, "table");
  check_ndim("embedding", table, 2, "table");
  check_index_range("embedding", idx, 0, table.dim(0));
  Shape shape = idx.shape();
  shape.push_back(table.dim(1));
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  Tensor out_rows = out.view({1, idx.numel(), table.dim(1)});
  gather_rows_forward(out_rows, table.view({1, table.dim(0), table.dim(1)}), idx.view({1, -1}));
  if (autograd::needs_grad({&table})) {
    auto node = std::make_unique<EmbeddingNode>();
    node->table = table;
    node->idx = idx;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
