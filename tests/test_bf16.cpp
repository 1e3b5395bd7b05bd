// BF16 as a dtype of the engine (tensor/bf16.h, ops/convert.h): the rounding (to nearest, ties to
// even; infinities, NaN and its sign kept; overflow to infinity) on every device, bit for bit
// alike; the conversion op on the tape, whose backward passes the gradient through in the input's
// dtype and adds to what is there; safetensors' BF16; and a clear error from ops that do not
// compute in BF16. Rounding has no derivative to check by finite differences: the backward is
// the identity by definition (as torch's `.to()`), and is checked exactly.
#include <cmath>
#include <cstring>
#include <limits>

#include "autograd/tape.h"
#include "ops/convert.h"
#include "ops/unary.h"
#include "tensor/safetensors.h"
#include "tests/devices.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// The bf16 bits of a converted tensor, as integers.
std::vector<uint16_t> bits_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu);
  std::vector<uint16_t> out(host.numel());
  for (int64_t i = 0; i < host.numel(); ++i) out[i] = host.data<bfloat16>()[i].bits;
  return out;
}

}  // namespace

TEST(Bf16, RoundsToNearestEvenAndKeepsInfinitiesAndNaN) {
  const std::vector<float> x = {
      1.0f,
      from_bits(0x3f808000u),  // 1 + 2^-8: halfway between 0x3f80 and 0x3f81, ties to the even 0x3f80
      from_bits(0x3f818000u),  // halfway between 0x3f81 and 0x3f82: to the even 0x3f82
      from_bits(0x3f808001u),  // just above halfway: up to 0x3f81
      -2.5f,
      std::numeric_limits<float>::max(),  // beyond BF16's largest finite (0x7f7f): infinity
      from_bits(0x7f7f7fffu),             // below halfway to infinity: the largest finite
      INFINITY,
      -INFINITY,
      from_bits(0x7fc00001u),  // a quiet NaN
      from_bits(0xff800001u),  // a signalling NaN, negative: stays negative, becomes quiet
      from_bits(0x00000001u),  // the smallest subnormal: rounds to zero
      -0.0f};
  const std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f80, 0x7f7f,
                                      0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x0000, 0x8000};
  const int64_t n = static_cast<int64_t>(x.size());
  for (Device device : devices_here()) {
    const Tensor t = ops::convert(Tensor::from_vector<float>(x, {n}).to(device), DType::bf16);
    EXPECT_EQ(t.dtype(), DType::bf16);
    EXPECT_EQ(bits_of(t), want) << device_name(device);
    // back to f32: exact (every bf16 is an f32); NaN stays NaN with its sign
    const std::vector<double> back = ops::convert(t, DType::f32).to_double_vector();
    for (int64_t i = 0; i < n; ++i) {
      const float expect = bf16_value(want[i]);
      if (std::isnan(expect)) {
        EXPECT_TRUE(std::isnan(back[i]) && std::signbit(back[i]) == std::signbit(expect)) << i;
      } else {
        EXPECT_EQ(back[i], expect) << device_name(device) << " element " << i;
        EXPECT_EQ(std::signbit(back[i]), std::signbit(expect)) << i;
      }
    }
  }
}

// From f64 the rounding is one rounding, not two through f32: 1 + 2^-8 + 2^-40 is just above the
// tie between 1 and 1 + 2^-7, though as a float it is the tie itself (which would go to 1).
TEST(Bf16, FromF64RoundsOnce) {
  const Tensor x = Tensor::from_vector<double>({1.0 + 0x1p-8 + 0x1p-40, 1.0 + 0x1p-8, -(1.0 + 0x1p-8 + 0x1p-40)}, {3});
  EXPECT_EQ(bits_of(ops::convert(x, DType::bf16)), (std::vector<uint16_t>{0x3f81, 0x3f80, 0xbf81}));
  EXPECT_EQ(bits_of(x.to(DType::bf16)), (std::vector<uint16_t>{0x3f81, 0x3f80, 0xbf81}));
}

// Random values: every device gives the CPU's bits, and the rounding error is within half a unit
// in the last place (at most 2^-8 of the value: 8 significant bits).
TEST(Bf16, EveryDeviceRoundsAsTheCpu) {
  const Tensor x = Tensor::normal({4096}, 5, 0, 100.0);
  const std::vector<uint16_t> cpu = bits_of(ops::convert(x, DType::bf16));
  const std::vector<double> xs = x.to_double_vector();
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_LE(std::abs(bf16_value(cpu[i]) - xs[i]), 0x1p-8 * std::abs(xs[i])) << xs[i];
  for (Device device : devices_here())
    EXPECT_EQ(bits_of(ops::convert(x.to(device), DType::bf16)), cpu) << device_name(device);
  // the special values, eight (CUDA converts eight a thread) and seven (one a thread) of them:
  // infinities, NaN of both signs, a tie to even either way, beyond BF16's largest, a subnormal
  const std::vector<float> special = {INFINITY, -INFINITY, NAN, -NAN, 1.00390625f, 1.01171875f, 3.4e38f, 1e-40f};
  for (size_t n : {special.size(), special.size() - 1}) {
    const Tensor s = Tensor::from_vector<float>(std::vector<float>(special.begin(), special.begin() + n),
                                                {static_cast<int64_t>(n)});
    const std::vector<uint16_t> want = bits_of(ops::convert(s, DType::bf16));
    for (Device device : devices_here())
      EXPECT_EQ(bits_of(ops::convert(s.to(device), DType::bf16)), want) << device_name(device) << " " << n;
  }
}

// f32 → bf16 → f32 on the tape: the backward hands each input the output's gradient converted to
// its dtype, added to what its gradient already held.
TEST(Bf16, ConversionPassesTheGradientThroughAndAdds) {
  for (Device device : devices_here()) {
    Tensor x = Tensor::normal({3, 5}, 7, 0).to(device).set_requires_grad();
    const Tensor before = Tensor::normal({3, 5}, 8, 0);
    x.set_grad(before.clone().to(device));  // a copy: the backward adds into it in place
    const Tensor h = ops::convert(x, DType::bf16);
    const Tensor y = ops::convert(h, DType::f32);
    const Tensor dy = Tensor::normal({3, 5}, 9, 0);
    autograd::backward(y, dy.to(device));
    const std::vector<double> got = x.grad().to_double_vector(), b = before.to_double_vector(),
                              g = dy.to_double_vector();
    for (size_t i = 0; i < got.size(); ++i) {
      // dy rounded to bf16 on the way through h's gradient, then added in f32
      const float through = bf16_value(bf16_bits_of(static_cast<float>(g[i])));
      EXPECT_EQ(got[i], static_cast<float>(static_cast<float>(b[i]) + through)) << device_name(device) << " " << i;
    }
  }
}

TEST(Bf16, SafetensorsReadsTheStandardLayout) {
  // {"x": BF16 [2]}: 1.0 is 0x3f80 and -2.0 is 0xc000, little-endian
  const std::string header = R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  std::vector<char> bytes(8);
  const uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (unsigned char c : {0x80, 0x3f, 0x00, 0xc0}) bytes.push_back(static_cast<char>(c));
  const TensorFile f = parse_safetensors(bytes, "bf16 test");
  const Tensor& x = f.get("x");
  EXPECT_EQ(x.dtype(), DType::bf16);
  EXPECT_EQ(x.to_double_vector(), (std::vector<double>{1.0, -2.0}));
}

TEST(Bf16, OpsThatDoNotComputeInBf16SayWhich) {
  const Tensor h = ops::convert(Tensor::normal({4}, 1, 0), DType::bf16);
  try {
    ops::exp(h);
    FAIL() << "exp took a bf16 tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exp"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::convert(Tensor::from_vector<int32_t>({1, 2}, {2}), DType::bf16), Error);
}
