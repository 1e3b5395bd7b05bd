#pragma once
// The precision of the products (matmuls and attention's tile products) on the GPU: one
// process-wide setting, as PyTorch's allow_tf32 and autocast are, set by the commands from
// `--precision` (docs/engine.md, "Precision").
//   fp32  FP32 accuracy (the default): cuBLAS's FP32 products; attention's on the FP32 FMA
//         units or as split TF32 products on the tensor cores, whichever measured no less
//         accurate (cuda/attention/full_attention_flash.h)
//   tf32  TF32 tensor-core products with FP32 accumulation
//   bf16  BF16 operands with FP32 accumulation for the products; everything else (softmax
//         statistics, LayerNorm, the loss, reductions, weights and AdamW's state) stays FP32
// The CPU computes in FP32 (or f64) whatever the setting: the commands refuse tf32 and bf16 on
// the CPU, and the emulated GPU (cast_emu) runs them for checking.
#include <cstdint>
#include <string>
#include <string_view>

namespace cast {

enum class Precision : uint8_t { fp32, tf32, bf16 };

const char* precision_name(Precision p);
// "fp32", "tf32" or "bf16"; throws a UsageError naming the choices otherwise.
Precision parse_precision(std::string_view name);

Precision current_precision();
void set_precision(Precision p);

// How the GPU's matmuls take their operands at bf16: as BF16 copies (the engine's choice), or as
// the FP32 tensors with cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF, which an H200 ran on TF32 kernels.
// `cast bench --bf16-gemm fast16bf` sets the other for one benchmark, so that both can be timed.
enum class Bf16Gemm : uint8_t { bf16_operands, fast16bf };
Bf16Gemm bf16_gemm();
void set_bf16_gemm(Bf16Gemm way);

// Sets the precision for a scope and restores the previous one at its end.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(Precision p) : previous_(current_precision()) { set_precision(p); }
  ~PrecisionGuard() { set_precision(previous_); }
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  Precision previous_;
};

}  // namespace cast
