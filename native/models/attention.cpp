// The scalar reference kernels (written as literally as the orders in
// attention.h) and the run-time dispatch. The SIMD paths need pages of 16
// keys and heads of a multiple of 16 values (every model we load); anything
// else runs here, with the same results by definition.
#include "models/attention.h"

#include <cmath>

#include "core/cpu.h"
#include "quant/quant.h"

namespace ctx {

namespace {

float hsum16(float* a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

void scores_scalar(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j = 0; j < n; ++j) {
    float acc[16] = {0};
    for (int d = 0; d < hd; ++d)
      acc[d % 16] = std::fma(q[d], f16_to_f32(kt[static_cast<size_t>(d) * stride + j]), acc[d % 16]);
    scores[j] = hsum16(acc) * scale;
  }
}

float max_scalar(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::fmax(m, x[i]);
  return m;
}

void scale_round_scalar(float* x, int n, float scale) {
  for (int i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i] * scale));
}

void accumulate_scalar(const float* p, const uint16_t* const* pages, int pt, int v_stride, int n, int hd,
                       float* out) {
  for (int d = 0; d < hd; ++d) {
    float acc[16] = {0};
    for (int k = 0; k < n; ++k) {
      const uint16_t* row = pages[k / pt] + static_cast<size_t>(k % pt) * v_stride;
      acc[k % 16] = std::fma(p[k], f16_to_f32(row[d]), acc[k % 16]);
    }
    out[d] = hsum16(acc);
  }
}

void scores_q8_scalar(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                      float* scores) {
  for (int j = 0; j < n; ++j) {
    float acc[16] = {0};
    for (int d = 0; d < hd; ++d) {
      const float k = f16_to_f32(ks[static_cast<size_t>(d / 32) * stride + j]) *
                      static_cast<float>(kq[static_cast<size_t>(d) * stride + j]);
      acc[d % 16] = std::fma(q[d], k, acc[d % 16]);
    }
    scores[j] = hsum16(acc) * scale;
  }
}

void accumulate_q8_scalar(const float* p, const int8_t* const* pages, const uint16_t* const* scales, int pt,
                          int v_stride, int s_stride, int n, int hd, float* out) {
  for (int d = 0; d < hd; ++d) {
    float acc[16] = {0};
    for (int k = 0; k < n; ++k) {
      const int8_t* row = pages[k / pt] + static_cast<size_t>(k % pt) * v_stride;
      const uint16_t* sc = scales[k / pt] + static_cast<size_t>(k % pt) * s_stride;
      acc[k % 16] = std::fma(p[k] * f16_to_f32(sc[d / 32]), static_cast<float>(row[d]), acc[k % 16]);
    }
    out[d] = hsum16(acc);
  }
}

bool simd_shape(int hd, int pt) { return hd % 16 == 0 && pt == 16; }

}  // namespace

void attn_scores_f16(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                     int score_stride) {
  if (hd % 16 == 0 && active_isa() == Isa::avx512)
    return attn::scores_avx512(q, g, kt, hd, stride, n, scale, scores, score_stride);
  for (int h = 0; h < g; ++h) {
    const float* qh = q + static_cast<size_t>(h) * hd;
    float* out = scores + static_cast<size_t>(h) * score_stride;
    if (hd % 16 == 0 && active_isa() == Isa::avx2)
      attn::scores_avx2(qh, kt, hd, stride, n, scale, out);
    else
      scores_scalar(qh, kt, hd, stride, n, scale, out);
  }
}

float max_f32(const float* x, int n) {
  switch (active_isa()) {
    case Isa::avx512: return attn::max_avx512(x, n);
    case Isa::avx2: return attn::max_avx2(x, n);
    default: return max_scalar(x, n);
  }
}

void scale_round_f16(float* x, int n, float scale) {
  switch (active_isa()) {
    case Isa::avx512: return attn::scale_round_avx512(x, n, scale);
    case Isa::avx2: return attn::scale_round_avx2(x, n, scale);
    default: return scale_round_scalar(x, n, scale);
  }
}

void attn_accumulate_f16(const float* p, int p_stride, int g, const uint16_t* const* pages, int pt, int v_stride, int n,
                         int hd, float* out) {
  if (simd_shape(hd, pt) && active_isa() == Isa::avx512)
    return attn::accumulate_avx512(p, p_stride, g, pages, v_stride, n, hd, out);
  for (int h = 0; h < g; ++h) {
    const float* ph = p + static_cast<size_t>(h) * p_stride;
    float* oh = out + static_cast<size_t>(h) * hd;
    if (simd_shape(hd, pt) && active_isa() == Isa::avx2)
      attn::accumulate_avx2(ph, pages, v_stride, n, hd, oh);
    else
      accumulate_scalar(ph, pages, pt, v_stride, n, hd, oh);
  }
}

void attn_scores_q8(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores, int score_stride) {
  if (hd % 16 == 0 && active_isa() == Isa::avx512)
    return attn::scores_q8_avx512(q, g, kq, ks, hd, stride, n, scale, scores, score_stride);
  for (int h = 0; h < g; ++h) {
    const float* qh = q + static_cast<size_t>(h) * hd;
    float* out = scores + static_cast<size_t>(h) * score_stride;
    if (hd % 16 == 0 && active_isa() == Isa::avx2)
      attn::scores_q8_avx2(qh, kq, ks, hd, stride, n, scale, out);
    else
      scores_q8_scalar(qh, kq, ks, hd, stride, n, scale, out);
  }
}

void attn_accumulate_q8(const float* p, int p_stride, int g, const int8_t* const* pages, const uint16_t* const* scales,
                        int pt, int v_stride, int s_stride, int n, int hd, float* out) {
  if (simd_shape(hd, pt) && active_isa() == Isa::avx512)
    return attn::accumulate_q8_avx512(p, p_stride, g, pages, scales, v_stride, s_stride, n, hd, out);
  for (int h = 0; h < g; ++h) {
    const float* ph = p + static_cast<size_t>(h) * p_stride;
    float* oh = out + static_cast<size_t>(h) * hd;
    if (simd_shape(hd, pt) && active_isa() == Isa::avx2)
      attn::accumulate_q8_avx2(ph, pages, scales, v_stride, s_stride, n, hd, oh);
    else
      accumulate_q8_scalar(ph, pages, scales, pt, v_stride, s_stride, n, hd, oh);
  }
}

}  // namespace ctx
