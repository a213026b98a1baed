// Attention kernels on AVX-512 (attention_simd.h): 16 keys or values a zmm,
// up to 16 queries a pass (32 registers hold their sums).
#include <immintrin.h>

#include <cmath>

#include "kernels/attention/attention_simd.h"
#include "kernels/simd_f32.h"

namespace ctx::attn {

namespace {

struct Avx512 : F32x16 {
  static constexpr int kAcc = 16, kMaxGroup = 16;  // 32 registers: a group's sums, R = 16 / G a query at a time
  static constexpr int kAccChunks = 16, kRegs = 32;  // weighted sums: G x (16 / G) registers, G weights, a value
};

}  // namespace

void scores_avx512(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                   int score_stride) {
  path_scores<Avx512>(q, g, kt, hd, stride, n, scale, scores, score_stride);
}

void scores_q8_avx512(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                      float scale, float* scores, int score_stride) {
  path_scores_q8<Avx512>(q, g, kq, ks, hd, stride, n, scale, scores, score_stride);
}

void accumulate_avx512(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared,
                      int /*pt: 16*/, int v_stride, const int* n, int hd, float* const* out, bool hot) {
  path_accumulate<Avx512>(p, p_stride, g, pages, shared, v_stride, n, hd, out, hot);
}

void accumulate_q8_avx512(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                         const uint16_t* const* const* scales, int shared, int /*pt: 16*/, int v_stride, int s_stride,
                         const int* n, int hd, float* const* out, bool hot) {
  path_accumulate_q8<Avx512>(p, p_stride, g, pages, scales, shared, v_stride, s_stride, n, hd, out, hot);
}

float max_avx512(const float* x, int n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
  }
  return _mm512_reduce_max_ps(m);
}

void scale_round_avx512(float* x, int n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT);
    _mm512_storeu_ps(x + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), s), _MM_FROUND_TO_NEAREST_INT);
    _mm512_mask_storeu_ps(x + i, k, _mm512_cvtph_ps(h));
  }
}

}  // namespace ctx::attn
