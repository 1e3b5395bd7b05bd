#include "tensor/broadcast.h"

#include <algorithm>

namespace cast {

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t nd = std::max(a.size(), b.size());
  CAST_CHECK(nd <= kMaxDims, "{}: at most {} dims are supported, got {}", op, kMaxDims, nd);
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    CAST_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} do not broadcast", op, shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

static void fill_strides(const Shape& out, const Shape& in, int64_t* stride) {
  size_t nd = out.size(), lead = nd - in.size();
  int64_t s = 1;
  for (size_t i = nd; i-- > 0;) {
    int64_t d = i < lead ? 1 : in[i - lead];
    stride[i] = d == 1 ? 0 : s;
    s *= d;
  }
}

BroadcastIndex make_broadcast_index(const Shape& out, const Shape& a, const Shape& b) {
  BroadcastIndex idx;
  idx.ndim = static_cast<int>(out.size());
  for (size_t i = 0; i < out.size(); ++i) idx.shape[i] = out[i];
  fill_strides(out, a, idx.stride_a);
  fill_strides(out, b, idx.stride_b);
  return idx;
}

BroadcastIndex coalesce(const BroadcastIndex& idx) {
  BroadcastIndex out;
  for (int d = 0; d < idx.ndim; ++d) {
    if (idx.shape[d] == 1) continue;
    const int last = out.ndim - 1;
    if (last >= 0 && out.stride_a[last] == idx.stride_a[d] * idx.shape[d] &&
        out.stride_b[last] == idx.stride_b[d] * idx.shape[d]) {
      out.shape[last] *= idx.shape[d];  // the outer dimension steps as the inner one continued
      out.stride_a[last] = idx.stride_a[d];
      out.stride_b[last] = idx.stride_b[d];
      continue;
    }
    out.shape[out.ndim] = idx.shape[d];
    out.stride_a[out.ndim] = idx.stride_a[d];
    out.stride_b[out.ndim] = idx.stride_b[d];
    ++out.ndim;
  }
  return out;  // ndim 0: a single element at offset 0
}

}  // namespace cast
