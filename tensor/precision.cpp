#include "tensor/precision.h"

#include <atomic>

#include "tensor/error.h"

namespace cast {

namespace {
std::atomic<Precision> g_precision{Precision::fp32};
std::atomic<Bf16Gemm> g_bf16_gemm{Bf16Gemm::bf16_operands};
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    default: return "fp32";
  }
}

Precision parse_precision(std::string_view name) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16})
    if (name == precision_name(p)) return p;
  throw UsageError(fmt::format("precision '{}' is not one of fp32, tf32, bf16", name));
}

Precision current_precision() { return g_precision.load(std::memory_order_relaxed); }
void set_precision(Precision p) { g_precision.store(p, std::memory_order_relaxed); }

Bf16Gemm bf16_gemm() { return g_bf16_gemm.load(std::memory_order_relaxed); }
void set_bf16_gemm(Bf16Gemm way) { g_bf16_gemm.store(way, std::memory_order_relaxed); }

}  // namespace cast
