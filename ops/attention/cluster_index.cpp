#include "ops/attention/cluster_index.h"

#include <vector>

#include "ops/attention/steps.h"
#include "ops/attention/clustering.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/cluster_index.h"
#include "cuda/attention/clustering.h"
#endif

namespace cast::ops {

namespace {
std::vector<int64_t> host_ints(const Tensor& t) {
  auto v = t.to_double_vector();
  return std::vector<int64_t>(v.begin(), v.end());
}

Tensor ints_like(const std::vector<int64_t>& v, const Shape& shape, const Tensor& like_device) {
  std::vector<int32_t> w(v.begin(), v.end());
  return Tensor::from_vector<int32_t>(w, shape, like_device.device());
}

}  // namespace

Tensor slot_mask(const Tensor& members, const Shape& shape, const Tensor& like) {
#ifdef CAST_WITH_CUDA
  if (members.is_cuda()) {
    Tensor mask = Tensor::empty(shape, like.dtype(), Device::cuda);
    cuda::slot_mask(mask, members);
    return mask;
  }
#endif
  auto ids = members.to_double_vector();
  std::vector<double> m(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) m[i] = ids[i] >= 0 ? 1.0 : 0.0;
  return constant_like(m, shape, like);
}

Tensor member_weight_index(const Tensor& members, int64_t C, int64_t kappa) {
  const int64_t BH = members.numel() / (C * kappa);
#ifdef CAST_WITH_CUDA
  if (members.is_cuda()) {
    Tensor out = Tensor::empty({BH, C * kappa}, DType::i32, Device::cuda);
    cuda::member_weight_index(out, members, C, kappa);
    return out;
  }
#endif
  auto ids = host_ints(members);
  std::vector<int64_t> flat(ids.size());
  for (size_t e = 0; e < ids.size(); ++e)
    flat[e] = ids[e] >= 0 ? ids[e] * C + static_cast<int64_t>((e / kappa) % C) : -1;
  return ints_like(flat, {BH, C * kappa}, members);
}

Tensor inverse_cluster_counts(const Tensor& assign, int64_t clusters, const Tensor& like) {
#ifdef CAST_WITH_CUDA
  if (assign.is_cuda() && like.dtype() == DType::f32) {  // the kernel is f32; other dtypes loop on the host
    Tensor out = Tensor::empty({assign.dim(0), clusters}, DType::f32, Device::cuda);
    cuda::cluster_counts(out, assign, clusters, /*inverse=*/true);
    return out;
  }
#endif
  auto c = cluster_counts(assign, clusters, like.dtype()).to_double_vector();
  for (double& x : c) x = x > 0 ? 1.0 / x : 0.0;
  return constant_like(c, {assign.dim(0), clusters}, like);
}

void top_key_masks(Tensor* slots, Tensor& outside, const Tensor& top_keys, const Tensor& assign, const Tensor& a_c) {
  const int64_t B = a_c.dim(0), H = a_c.dim(1), C = a_c.dim(2), N = a_c.dim(3), BH = B * H, top = top_keys.dim(3);
#ifdef CAST_WITH_CUDA
  if (a_c.is_cuda() && a_c.dtype() == DType::f32) {
    outside = Tensor::full({B, H, C, N}, 1.0, DType::f32, Device::cuda);
    cuda::clear_top_keys(outside, top_keys, N, top);
    if (slots) {
      *slots = Tensor::empty({BH * N, top}, DType::f32, Device::cuda);
      cuda::top_key_slots(*slots, top_keys, assign, C, N, top);
    }
    return;
  }
#endif
  auto t_ids = host_ints(top_keys), a_ids = host_ints(assign);
  std::vector<double> slot(BH * N * top, 0.0), out(BH * C * N, 1.0);
  for (int64_t g = 0; g < BH; ++g)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t j = a_ids[g * N + i];
      if (j < 0) continue;
      for (int64_t s = 0; s < top; ++s) slot[(g * N + i) * top + s] = t_ids[(g * C + j) * top + s] >= 0 ? 1 : 0;
    }
  for (int64_t r = 0; r < BH * C; ++r)
    for (int64_t s = 0; s < top; ++s)
      if (t_ids[r * top + s] >= 0) out[r * N + t_ids[r * top + s]] = 0.0;
  if (slots) *slots = constant_like(slot, {BH * N, top}, a_c);
  outside = constant_like(out, {B, H, C, N}, a_c);
}

}  // namespace cast::ops
