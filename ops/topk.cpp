#include "ops/topk.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "ops/dispatch.h"
#include "ops/softmax.h"
#include "math/topk_order.h"
#ifdef CAST_WITH_CUDA
#include "cuda/topk.h"
#endif

namespace cast::ops {

void topk_forward(Tensor& idx, const Tensor& x, int64_t k, const Tensor& mask) {
  check_float("topk", x, "x");
  check_dtype("topk", idx, DType::i32, "indices");
  MaskRows m = mask_rows("topk", x, mask);
  CAST_CHECK(k >= 0 && k <= m.len, "topk: k = {} outside [0, {}]", k, m.len);
  CAST_CHECK(idx.numel() == m.rows * k, "topk: output {} must hold {} rows of {}", idx.describe(), m.rows, k);
  CAST_ON_CUDA(x, cuda::topk(idx, x, mask, m.rows, m.len, m.group, k));
  CAST_DISPATCH_FLOAT(x.dtype(), "topk", [&] {
    const T* pm = mask.defined() ? mask.data<T>() : nullptr;
    CAST_OMP("omp parallel for if (m.rows * m.len > 16384)")
    for (int64_t r = 0; r < m.rows; ++r) {
      const T* xr = x.data<T>() + r * m.len;
      const T* mr = pm ? pm + (r / m.group) * m.len : nullptr;
      std::vector<int32_t> order;
      order.reserve(m.len);
      for (int64_t j = 0; j < m.len; ++j)
        if (!mr || mr[j] != T(0)) order.push_back(static_cast<int32_t>(j));
      const int64_t take = std::min<int64_t>(k, order.size());
      std::partial_sort(order.begin(), order.begin() + take, order.end(),
                        [&](int32_t a, int32_t b) { return ranks_before(xr[a], a, xr[b], b); });
      int32_t* out = idx.data<int32_t>() + r * k;
      for (int64_t j = 0; j < k; ++j) out[j] = j < take ? order[j] : -1;
    }
  });
}

Tensor topk(const Tensor& x, int64_t k, const Tensor& mask) {
  check_float("topk", x, "x");
  Shape shape = x.shape();
  CAST_CHECK(!shape.empty(), "topk: x must have at least one dim");
  shape.back() = k;
  Tensor idx = Tensor::empty(shape, DType::i32, x.device());
  topk_forward(idx, x, k, mask);
  return idx;
}

}  // namespace cast::ops
