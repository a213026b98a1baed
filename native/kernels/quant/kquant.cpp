// The K-quants: Q8K activation quantization, the scalar reference kernels and
// the entry points (the chosen path's kernels, kernels/kernels.h).
//
// The scalar kernel is the canonical order of quant.h written literally: each
// super-block is unpacked to its integer weights q(e), sub-block scales and
// mins, the 8 int32 lanes are summed element by element, then the float steps
// follow in the order the header gives. The SIMD paths are tested against it
// bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"
#include "kernels/quant/quant_impl.h"

namespace ctx {

using qk::hsum8;

void quantize_row_q8k(const float* x, BlockQ8K* y, int n) { kernels().quantize_row_q8k(x, y, n); }

void qk::quantize_row_q8k_scalar(const float* x, BlockQ8K* y, int n) {
  for (int b = 0; b < n / QK_K; ++b, x += QK_K) {
    BlockQ8K& out = y[b];
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      out.d = 0.0f;
      std::memset(out.qs, 0, sizeof(out.qs));
      std::memset(out.bsums, 0, sizeof(out.bsums));
      continue;
    }
    // -127 / max, as ggml (the sign makes the largest element -127).
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; ++j) out.qs[j] = static_cast<int8_t>(std::min(127, qk::round_half_even(iscale * x[j])));
    for (int g = 0; g < QK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += out.qs[16 * g + j];
      out.bsums[g] = static_cast<int16_t>(sum);
    }
    out.d = 1.0f / iscale;
  }
}

namespace {

// One super-block in the terms of quant.h: integer weights q(e), the scale of
// each group of 16 (Q4_K / Q5_K repeat theirs for both halves of a sub-block
// of 32), the mins (Q2_K: 16, Q4_K / Q5_K: 8), d and dmin as floats.
struct KBlock {
  int q[QK_K];
  int sc[16];
  int m[16];
  float d, dmin;
};

void unpack(DType t, const uint8_t* p, KBlock& k) {
  switch (t) {
    case DType::Q2_K: {
      const auto& b = *reinterpret_cast<const BlockQ2_K*>(p);
      for (int e = 0; e < QK_K; ++e) k.q[e] = qk::q2_low_bits(b.qs, e);
      for (int s = 0; s < 16; ++s) {
        k.sc[s] = b.scales[s] & 0xF;
        k.m[s] = b.scales[s] >> 4;
      }
      k.d = f16_to_f32(b.d);
      k.dmin = f16_to_f32(b.dmin);
      return;
    }
    case DType::Q3_K: {
      const auto& b = *reinterpret_cast<const BlockQ3_K*>(p);
      for (int e = 0; e < QK_K; ++e) k.q[e] = qk::q2_low_bits(b.qs, e) - (((b.hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
      uint8_t sc[16];
      qk::unpack_q3k_scales(b.scales, sc);
      for (int s = 0; s < 16; ++s) k.sc[s] = sc[s] - 32;
      k.d = f16_to_f32(b.d);
      k.dmin = 0.0f;
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      // Same header; Q5_K has qh between the scales and the nibbles.
      const auto& b = *reinterpret_cast<const BlockQ4_K*>(p);
      const uint8_t* qs = t == DType::Q5_K ? reinterpret_cast<const BlockQ5_K*>(p)->qs : b.qs;
      for (int e = 0; e < QK_K; ++e) {
        k.q[e] = (qs[32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 0xF;
        if (t == DType::Q5_K) k.q[e] |= ((reinterpret_cast<const BlockQ5_K*>(p)->qh[e % 32] >> (e / 32)) & 1) << 4;
      }
      uint8_t sc[8], m[8];
      qk::unpack_k4_scales(b.scales, sc, m);
      for (int s = 0; s < 8; ++s) {
        k.sc[2 * s] = k.sc[2 * s + 1] = sc[s];
        k.m[s] = m[s];
      }
      k.d = f16_to_f32(b.d);
      k.dmin = f16_to_f32(b.dmin);
      return;
    }
    case DType::Q6_K: {
      const auto& b = *reinterpret_cast<const BlockQ6_K*>(p);
      for (int e = 0; e < QK_K; ++e) k.q[e] = qk::q6k_value(b, e);
      for (int s = 0; s < 16; ++s) k.sc[s] = b.scales[s];
      k.d = f16_to_f32(b.d);
      k.dmin = 0.0f;
      return;
    }
    default: {  // Q8_K
      const auto& b = *reinterpret_cast<const BlockQ8K*>(p);
      for (int e = 0; e < QK_K; ++e) k.q[e] = b.qs[e];
      for (int s = 0; s < 16; ++s) k.sc[s] = 1;
      k.d = b.d;
      k.dmin = 0.0f;
      return;
    }
  }
}

float dot_k_scalar(DType t, const uint8_t* w, const BlockQ8K* x, int nb) {
  const size_t bb = dtype_row_bytes(t, QK_K);
  float acc[8] = {}, acc1 = 0.0f, summ = 0.0f;
  KBlock k;
  for (int i = 0; i < nb; ++i) {
    unpack(t, w + i * bb, k);
    const BlockQ8K& y = x[i];
    const int16_t* bs = y.bsums;
    int32_t isum[8] = {};
    for (int e = 0; e < QK_K; ++e) isum[(e % 32) / 4] += k.sc[e / 16] * k.q[e] * y.qs[e];
    if (t == DType::Q6_K) {  // llama.cpp's x86 tiled gemm: one exact sum a super-block
      int32_t total = 0;
      for (int l = 0; l < 8; ++l) total += isum[l] - 32 * (k.sc[2 * l] * bs[2 * l] + k.sc[2 * l + 1] * bs[2 * l + 1]);
      acc1 = std::fma(static_cast<float>(total) * k.d, y.d, acc1);
      continue;
    }
    if (t == DType::Q4_K) {  // llama.cpp's x86 (repacked) order: a sum per 64 values
      for (int j = 0; j < 4; ++j) {
        int32_t pair = 0;
        for (int e = 64 * j; e < 64 * j + 64; ++e) pair += k.sc[e / 16] * k.q[e] * y.qs[e];
        const int32_t mk = k.m[2 * j] * (bs[4 * j] + bs[4 * j + 1]) + k.m[2 * j + 1] * (bs[4 * j + 2] + bs[4 * j + 3]);
        acc1 = std::fma(static_cast<float>(pair), k.d * y.d, acc1);
        summ = std::fma(static_cast<float>(mk), k.dmin * y.d, summ);
      }
      continue;
    }
    const float d = y.d * k.d;
    const float dmin = -(y.d * k.dmin);
    if (t == DType::Q2_K)
      for (int l = 0; l < 8; ++l)
        acc[l] = std::fma(dmin, static_cast<float>(k.m[2 * l] * bs[2 * l] + k.m[2 * l + 1] * bs[2 * l + 1]), acc[l]);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(isum[l]), acc[l]);
    if (t == DType::Q5_K) {
      int32_t mk[4];
      for (int j = 0; j < 4; ++j)
        mk[j] = k.m[2 * j] * (bs[4 * j] + bs[4 * j + 1]) + k.m[2 * j + 1] * (bs[4 * j + 2] + bs[4 * j + 3]);
      summ = std::fma(dmin, static_cast<float>(mk[0] + mk[1] + mk[2] + mk[3]), summ);
    }
  }
  if (t == DType::Q4_K) return acc1 - summ;
  if (t == DType::Q6_K) return acc1;
  float dot = hsum8(acc);
  if (t == DType::Q5_K) dot = dot + summ;
  return dot;
}

void matmul_k_rows(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                     size_t y_stride) {
  const int nb = n_in / QK_K;
  const size_t row_bytes = dtype_row_bytes(t, n_in);
  const auto* w = static_cast<const uint8_t*>(W);
  for (int o = o0; o < o1; ++o)
    for (int r = 0; r < n_x; ++r)
      Y[r * y_stride + o] = dot_k_scalar(t, w + o * row_bytes, Xk + static_cast<size_t>(r) * nb, nb);
}

}  // namespace

void qk::matmul_k_scalar(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                         size_t y_stride) {
  matmul_k_rows(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

void matmul_k(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
              size_t y_stride) {
  if (!dtype_is_kquant(t)) throw qk::unsupported_type(t);
  kernels().matmul_k(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx
