// Training steps on the CUDA device (the emulated one in CI): what a step costs in device
// allocations. After its largest shapes have been seen, a step makes no cudaMalloc call, for
// batches padded to other lengths and of other sizes too.
#include <cstdio>

#include "autograd/tape.h"
#include "nn/transformer.h"
#include "ops/adamw.h"
#include "ops/ops.h"
#include "tests/test_util.h"
#ifdef CAST_WITH_CUDA
#include "cuda/runtime.h"
#endif

using namespace cast;

class CudaTrainingSteps : public ::testing::TestWithParam<nn::Mechanism> {};

TEST_P(CudaTrainingSteps, VaryingShapesStopAllocatingAfterTheLargest) {
  SKIP_WITHOUT_GPU();
#ifdef CAST_WITH_CUDA
  nn::ModelConfig m;
  m.vocab = 8, m.max_len = 16, m.dim = 16, m.heads = 2, m.mlp_dim = 32, m.layers = 1, m.classes = 3;
  m.dropout = 0.1;
  m.attention.mechanism = GetParam();
  m.attention.clusters = 4, m.attention.cluster_size = 6, m.attention.topk = 5, m.attention.bits = 8;
  m.attention.iterations = 2;
  nn::Transformer model(m, DType::f32, Device::cuda);
  nn::ParamList params = model.parameters();
  std::vector<Tensor> mo, ve;
  for (auto& [name, t] : params) {
    mo.push_back(Tensor::zeros(t->shape(), t->dtype(), Device::cuda));
    ve.push_back(Tensor::zeros(t->shape(), t->dtype(), Device::cuda));
  }
  int64_t t = 0;
  auto step = [&](int64_t B, int64_t N) {
    std::vector<int32_t> tokens(B * N), labels(B);
    std::vector<float> mask(B * N);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t length = N - b % 3;  // padded rows
      for (int64_t i = 0; i < N; ++i) {
        tokens[b * N + i] = i < length ? static_cast<int32_t>(1 + (b * 5 + i * 3) % 7) : 0;
        mask[b * N + i] = i < length ? 1.f : 0.f;
      }
      labels[b] = static_cast<int32_t>(b % 3);
    }
    nn::Batch batch;
    batch.tokens = Tensor::from_vector<int32_t>(tokens, {B, N}, Device::cuda);
    batch.mask = Tensor::from_vector<float>(mask, {B, N}, Device::cuda);
    batch.labels = Tensor::from_vector<int32_t>(labels, {B}, Device::cuda);
    Tensor loss = ops::cross_entropy(model.forward(batch, true), batch.labels);
    autograd::backward(loss);
    ops::AdamWStep s{1e-3, 0.9, 0.98, 1e-9, 0.0, ++t};
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& p = *params[i].second;
      if (!p.grad().defined()) continue;
      ops::adamw_update(p, p.grad(), mo[i], ve[i], s);
      p.reset_grad();
    }
  };
  step(6, 16);  // the largest batch, twice: every block a step needs is now cached
  step(6, 16);
  const cuda::MemoryStats before = cuda::memory_stats();
  step(6, 16);
  const cuda::MemoryStats after = cuda::memory_stats();
  // Not yet a limit (the host still picks clusters and reads the loss, the clip norm and
  // index ranges back): recorded, so that the cost of a step's round trips is visible.
  RecordProperty("to_host_per_step", static_cast<int>(after.to_host - before.to_host));
  RecordProperty("to_device_per_step", static_cast<int>(after.to_device - before.to_device));
  std::printf("%s step: %zu device-to-host copies, %zu host-to-device copies\n", nn::mechanism_name(GetParam()),
              after.to_host - before.to_host, after.to_device - before.to_device);
  const size_t mallocs = cuda::memory_stats().device_mallocs;
  for (auto [B, N] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {6, 11}, {2, 16}})
    step(B, N);
  EXPECT_EQ(cuda::memory_stats().device_mallocs, mallocs) << "cudaMalloc calls after the warm-up steps";
#endif
}

INSTANTIATE_TEST_SUITE_P(AllMechanisms, CudaTrainingSteps,
                         ::testing::Values(nn::Mechanism::full, nn::Mechanism::cast, nn::Mechanism::clustered,
                                           nn::Mechanism::iclustered),
                         [](const auto& info) { return std::string(nn::mechanism_name(info.param)); });
