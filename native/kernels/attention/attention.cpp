// The scalar reference kernels (written as literally as the orders in
// attention.h) and the entry points. The SIMD paths need pages of 16 keys and
// heads of a multiple of 16 values (every model we load); anything else runs
// the scalar kernels here, with the same results by definition.
#include "kernels/attention/attention.h"

#include <cmath>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"

namespace ctx {

namespace {

float hsum16(float* a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

void scores_head(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j = 0; j < n; ++j) {
    float acc[16] = {0};
    for (int d = 0; d < hd; ++d)
      acc[d % 16] = std::fma(q[d], f16_to_f32(kt[static_cast<size_t>(d) * stride + j]), acc[d % 16]);
    scores[j] = hsum16(acc) * scale;
  }
}

void accumulate_head(const float* p, const uint16_t* const* pages, int pt, int v_stride, int n, int hd, float* out) {
  for (int d = 0; d < hd; ++d) {
    float acc[16] = {0};
    for (int k = 0; k < n; ++k) {
      const uint16_t* row = pages[k / pt] + static_cast<size_t>(k % pt) * v_stride;
      acc[k % 16] = std::fma(p[k], f16_to_f32(row[d]), acc[k % 16]);
    }
    out[d] = hsum16(acc);
  }
}

void scores_q8_head(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
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

void accumulate_q8_head(const float* p, const int8_t* const* pages, const uint16_t* const* scales, int pt,
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

// A group on the scalar path is its queries one by one.
void attn::scores_scalar(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale,
                         float* scores, int score_stride) {
  for (int h = 0; h < g; ++h, q += hd, scores += score_stride) scores_head(q, kt, hd, stride, n, scale, scores);
}

void attn::accumulate_scalar(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int /*shared*/,
                             int pt, int v_stride, const int* n, int hd, float* const* out, bool /*hot*/) {
  for (int h = 0; h < g; ++h, p += p_stride) accumulate_head(p, pages[h], pt, v_stride, n[h], hd, out[h]);
}

void attn::scores_q8_scalar(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                            float scale, float* scores, int score_stride) {
  for (int h = 0; h < g; ++h, q += hd, scores += score_stride) scores_q8_head(q, kq, ks, hd, stride, n, scale, scores);
}

void attn::accumulate_q8_scalar(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                                const uint16_t* const* const* scales, int /*shared*/, int pt, int v_stride,
                                int s_stride, const int* n, int hd, float* const* out, bool /*hot*/) {
  for (int h = 0; h < g; ++h, p += p_stride)
    accumulate_q8_head(p, pages[h], scales[h], pt, v_stride, s_stride, n[h], hd, out[h]);
}

float attn::max_scalar(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::fmax(m, x[i]);
  return m;
}

void attn::scale_round_scalar(float* x, int n, float scale) {
  for (int i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i] * scale));
}

void attn_scores_f16(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                     int score_stride) {
  const Kernels& k = hd % 16 == 0 ? kernels() : scalar_kernels();
  k.attn_scores_f16(q, g, kt, hd, stride, n, scale, scores, score_stride);
}

float max_f32(const float* x, int n) { return kernels().max_f32(x, n); }

void scale_round_f16(float* x, int n, float scale) { kernels().scale_round_f16(x, n, scale); }

void attn_accumulate_f16(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared, int pt,
                         int v_stride, const int* n, int hd, float* const* out, bool hot) {
  const Kernels& k = simd_shape(hd, pt) ? kernels() : scalar_kernels();
  k.attn_accumulate_f16(p, p_stride, g, pages, shared, pt, v_stride, n, hd, out, hot);
}

void attn_scores_q8(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores, int score_stride) {
  const Kernels& k = hd % 16 == 0 ? kernels() : scalar_kernels();
  k.attn_scores_q8(q, g, kq, ks, hd, stride, n, scale, scores, score_stride);
}

void attn_accumulate_q8(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                        const uint16_t* const* const* scales, int shared, int pt, int v_stride, int s_stride,
                        const int* n, int hd, float* const* out, bool hot) {
  const Kernels& k = simd_shape(hd, pt) ? kernels() : scalar_kernels();
  k.attn_accumulate_q8(p, p_stride, g, pages, scales, shared, pt, v_stride, s_stride, n, hd, out, hot);
}

}  // namespace ctx
