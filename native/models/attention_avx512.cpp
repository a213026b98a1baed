#include <immintrin.h>

#include <cmath>

#include "models/attention.h"

namespace ctx::attn {

namespace {

// acc[0] = hsum16 of the 16 registers, lane by lane: for w in 8, 4, 2, 1: acc[i] += acc[i + w].
inline __m512 fold16(__m512* acc) {
#pragma GCC unroll 4
  for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
    for (int i = 0; i < w; ++i) acc[i] = _mm512_add_ps(acc[i], acc[i + w]);
  return acc[0];
}

inline __mmask16 first(int lanes) {
  return lanes >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << lanes) - 1);
}

inline __m512 load16_i8_f32(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

}  // namespace

// 16 keys a register; register r holds the partial sums over d = r (mod 16).
// key(d, j0, m) gives dimension d of keys j0.. (lanes outside m zero).
template <typename Key>
void score_keys(const float* q, int hd, int n, float scale, float* scores, Key key) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const __mmask16 m = first(n - j0);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
    for (int d0 = 0; d0 < hd; d0 += 16)
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[d0 + r]), key(d0 + r, j0, m), acc[r]);
    _mm512_mask_storeu_ps(scores + j0, m, _mm512_mul_ps(fold16(acc), _mm512_set1_ps(scale)));
  }
}

void scores_avx512(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  score_keys(q, hd, n, scale, scores, [&](int d, int j0, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kt + static_cast<size_t>(d) * stride + j0));
  });
}

void scores_q8_avx512(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                      float* scores) {
  score_keys(q, hd, n, scale, scores, [&](int d, int j0, __mmask16 m) {
    const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ks + static_cast<size_t>(d / 32) * stride + j0));
    const __m512 k = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, kq + static_cast<size_t>(d) * stride + j0)));
    return _mm512_mul_ps(s, k);
  });
}

// 16 values of the output a register; register j holds the partial sums over
// the keys in slot j of every page (pages of 16 keys: slot = key % 16).
void accumulate_avx512(const float* p, const uint16_t* const* pages, int v_stride, int n, int hd, float* out) {
  for (int d0 = 0; d0 < hd; d0 += 16) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    for (int i = 0; i * 16 < n; ++i) {
      const uint16_t* base = pages[i] + d0;
      const float* w = p + i * 16;
      const int nj = n - i * 16;
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if (j < nj) {
          const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + j * v_stride)));
          acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), v, acc[j]);
        }
      }
    }
    _mm512_storeu_ps(out + d0, fold16(acc));
  }
}

void accumulate_q8_avx512(const float* p, const int8_t* const* pages, const uint16_t* const* scales, int v_stride,
                          int s_stride, int n, int hd, float* out) {
  for (int d0 = 0; d0 < hd; d0 += 16) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
    for (int i = 0; i * 16 < n; ++i) {
      const int8_t* base = pages[i] + d0;
      const uint16_t* sc = scales[i] + d0 / 32;
      const float* w = p + i * 16;
      const int nj = n - i * 16;
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if (j < nj) {
          const __m512 pw = _mm512_set1_ps(w[j] * _cvtsh_ss(sc[j * s_stride]));
          acc[j] = _mm512_fmadd_ps(pw, load16_i8_f32(base + j * v_stride), acc[j]);
        }
      }
    }
    _mm512_storeu_ps(out + d0, fold16(acc));
  }
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
