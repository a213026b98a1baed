// Constants and per-ISA entry points of activations.cpp. The exp is ggml's
// (ggml_v_expf, AVX-512 form, from ARM's optimized-routines): llama.cpp's
// logits are the reference we are held to, and its softmax and SiLU round
// through this exp, so computing the same operations reproduces its bits.
//   z = fma(x, log2e, 0x1.8p23); n = z - 0x1.8p23           (n = round(x log2 e))
//   b = fma(-n, ln2_lo, fma(-n, ln2_hi, x)); u = b * b
//   j = fma(fma(fma(c5, b, c4), u, fma(c3, b, c2)), u, fma(c1, b, 1))
//   exp(x) = j * 2^n, rounded once (AVX-512 scalef); |n| > 192 gives 0 (n <= 0) or inf
#pragma once

#include <cmath>
#include <cstdint>

namespace ctx::act {

constexpr float kShift = 0x1.8p23f;
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e4p-1f;
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
constexpr float kC1 = 0x1.ffffecp-1f, kC2 = 0x1.fffdb6p-2f, kC3 = 0x1.555e66p-3f, kC4 = 0x1.573e2ep-5f,
                kC5 = 0x1.0e4020p-7f;

// RMS norm's second half for one row, given its sum of squares ss
// (activations.h); static, so each ISA's unit keeps its own copy.
static inline void rms_scale(const float* x, const float* w, float* out, int n, double ss, float eps) {
  const float mean = static_cast<float>(ss / n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

double exp_shift_sum_avx2(float* x, int n, float shift);
void silu_mul_avx2(float* g, const float* u, int n);
// Each path's kernels (the table's signatures, kernels/kernels.h); gelu_mul
// takes its table (f16 bits -> f16 bits, padded by 2 entries).
double exp_shift_sum_scalar(float* x, int n, float shift);
void silu_mul_scalar(float* g, const float* u, int n);
void gelu_mul_scalar(float* g, const float* u, int n, const uint16_t* table);
void rope_scalar(float* v, int n_heads, int hd, int half, bool neox, const float* cs);
void rope_avx2(float* v, int n_heads, int hd, int half, bool neox, const float* cs);
void rope_avx512(float* v, int n_heads, int hd, int half, bool neox, const float* cs);
void gelu_mul_avx2(float* g, const float* u, int n, const uint16_t* table);
void gelu_mul_avx512(float* g, const float* u, int n, const uint16_t* table);
double exp_shift_sum_avx512(float* x, int n, float shift);
void rmsnorm_rows_scalar(const float* x, const float* w, float* out, int n_rows, int n, float eps);
void rmsnorm_rows_avx2(const float* x, const float* w, float* out, int n_rows, int n, float eps);
void rmsnorm_rows_avx512(const float* x, const float* w, float* out, int n_rows, int n, float eps);
void silu_mul_avx512(float* g, const float* u, int n);

}  // namespace ctx::act
