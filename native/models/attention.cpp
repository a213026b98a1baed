#include "models/attention.h"

#include <cmath>

#include "core/cpu.h"
#include "quant/quant.h"

namespace ctx {

static void scores_scalar(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int d = 0; d < hd; ++d) acc = std::fma(q[d], f16_to_f32(kt[static_cast<size_t>(d) * stride + j]), acc);
    scores[j] = acc * scale;
  }
}

void attn_scores_f16(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  switch (active_isa()) {
    case Isa::avx512: return attn::scores_avx512(q, kt, hd, stride, n, scale, scores);
    case Isa::avx2: return attn::scores_avx2(q, kt, hd, stride, n, scale, scores);
    default: return scores_scalar(q, kt, hd, stride, n, scale, scores);
  }
}

static float max_scalar(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::fmax(m, x[i]);
  return m;
}

static void scale_round_scalar(float* x, int n, float scale) {
  for (int i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i] * scale));
}

static void accumulate_scalar(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) out[d] = std::fma(p[j], f16_to_f32(v[static_cast<size_t>(j) * v_stride + d]), out[d]);
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

void attn_accumulate_f16(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out) {
  switch (active_isa()) {
    case Isa::avx512: return attn::accumulate_avx512(p, v, v_stride, n, hd, out);
    case Isa::avx2: return attn::accumulate_avx2(p, v, v_stride, n, hd, out);
    default: return accumulate_scalar(p, v, v_stride, n, hd, out);
  }
}

// q8 K and V (int8 values, one f16 scale per 32): the orders of attention.h.

static void scores_q8_scalar(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                             float scale, float* scores) {
  for (int j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int d = 0; d < hd; ++d) {
      const float k = f16_to_f32(ks[static_cast<size_t>(d / 32) * stride + j]) *
                      static_cast<float>(kq[static_cast<size_t>(d) * stride + j]);
      acc = std::fma(q[d], k, acc);
    }
    scores[j] = acc * scale;
  }
}

void attn_scores_q8(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores) {
  switch (active_isa()) {
    case Isa::avx512: return attn::scores_q8_avx512(q, kq, ks, hd, stride, n, scale, scores);
    case Isa::avx2: return attn::scores_q8_avx2(q, kq, ks, hd, stride, n, scale, scores);
    default: return scores_q8_scalar(q, kq, ks, hd, stride, n, scale, scores);
  }
}

static void accumulate_q8_scalar(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride,
                                 int n, int hd, float* out) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) {
      const float pd = p[j] * f16_to_f32(vs[static_cast<size_t>(j) * s_stride + d / 32]);
      out[d] = std::fma(pd, static_cast<float>(vq[static_cast<size_t>(j) * v_stride + d]), out[d]);
    }
}

void attn_accumulate_q8(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride, int n,
                        int hd, float* out) {
  switch (active_isa()) {
    case Isa::avx512: return attn::accumulate_q8_avx512(p, vq, v_stride, vs, s_stride, n, hd, out);
    case Isa::avx2: return attn::accumulate_q8_avx2(p, vq, v_stride, vs, s_stride, n, hd, out);
    default: return accumulate_q8_scalar(p, vq, v_stride, vs, s_stride, n, hd, out);
  }
}

}  // namespace ctx
