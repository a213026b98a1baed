// The activation rounding of F16 / BF16 matmuls (quant.h round_row_f16 /
// round_row_bf16): the scalar path, in integer arithmetic, and the public
// entry points.
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"
#include "kernels/quant/quant_impl.h"

namespace ctx {

void qk::round_row_f16_scalar(const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = f16_to_f32_soft(f32_to_f16_soft(x[i]));
}

// ggml_compute_fp32_to_bf16, then widened back (the low 16 bits zero).
uint32_t qk::round_bits_bf16(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u | 0x00400000u) & 0xFFFF0000u;  // NaN: kept, made quiet
  return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
}

void qk::round_row_bf16_scalar(const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], sizeof(u));
    u = round_bits_bf16(u);
    std::memcpy(&y[i], &u, sizeof(u));
  }
}

void round_row_f16(const float* x, float* y, int n) { kernels().round_row_f16(x, y, n); }
void round_row_bf16(const float* x, float* y, int n) { kernels().round_row_bf16(x, y, n); }

}  // namespace ctx
