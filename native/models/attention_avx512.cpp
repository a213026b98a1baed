#include <immintrin.h>

#include <cmath>

#include "models/attention.h"

namespace ctx::attn {

void scores_avx512(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int lanes = n - j0 < 16 ? n - j0 : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << lanes) - 1);
    __m512 acc = _mm512_setzero_ps();
    const uint16_t* k = kt + j0;
    for (int d = 0; d < hd; ++d, k += stride) {
      const __m512 kv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k));
      acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), kv, acc);
    }
    _mm512_mask_storeu_ps(scores + j0, m, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
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

void accumulate_avx512(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out) {
  int d = 0;
  for (; d + 64 <= hd; d += 64) {  // four registers of the output row at a time
    __m512 a0 = _mm512_loadu_ps(out + d), a1 = _mm512_loadu_ps(out + d + 16);
    __m512 a2 = _mm512_loadu_ps(out + d + 32), a3 = _mm512_loadu_ps(out + d + 48);
    const uint16_t* row = v + d;
    for (int j = 0; j < n; ++j, row += v_stride) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      a0 = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row))), a0);
      a1 = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16))), a1);
      a2 = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32))), a2);
      a3 = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 48))), a3);
    }
    _mm512_storeu_ps(out + d, a0);
    _mm512_storeu_ps(out + d + 16, a1);
    _mm512_storeu_ps(out + d + 32, a2);
    _mm512_storeu_ps(out + d + 48, a3);
  }
  for (; d < hd; d += 16) {
    const int lanes = hd - d < 16 ? hd - d : 16;
    const __mmask16 k = static_cast<__mmask16>((1u << lanes) - 1);
    __m512 a = _mm512_maskz_loadu_ps(k, out + d);
    const uint16_t* row = v + d;
    for (int j = 0; j < n; ++j, row += v_stride)
      a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, row)), a);
    _mm512_mask_storeu_ps(out + d, k, a);
  }
}

static __m512 load16_i8_f32(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

void scores_q8_avx512(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                      float* scores) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int lanes = n - j0 < 16 ? n - j0 : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << lanes) - 1);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < hd / 32; ++b) {
      const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ks + static_cast<size_t>(b) * stride + j0));
      const int8_t* k = kq + static_cast<size_t>(b) * 32 * stride + j0;
      for (int d = b * 32; d < b * 32 + 32; ++d, k += stride) {
        const __m512 kv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, k)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_mul_ps(s, kv), acc);
      }
    }
    _mm512_mask_storeu_ps(scores + j0, m, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
  }
}

void accumulate_q8_avx512(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride, int n,
                          int hd, float* out) {
  int d = 0;
  for (; d + 64 <= hd; d += 64) {  // two scale blocks in four registers
    __m512 a0 = _mm512_loadu_ps(out + d), a1 = _mm512_loadu_ps(out + d + 16);
    __m512 a2 = _mm512_loadu_ps(out + d + 32), a3 = _mm512_loadu_ps(out + d + 48);
    const int8_t* row = vq + d;
    const uint16_t* sc = vs + d / 32;
    for (int j = 0; j < n; ++j, row += v_stride, sc += s_stride) {
      const __m512 p0 = _mm512_set1_ps(p[j] * _cvtsh_ss(sc[0]));
      const __m512 p1 = _mm512_set1_ps(p[j] * _cvtsh_ss(sc[1]));
      a0 = _mm512_fmadd_ps(p0, load16_i8_f32(row), a0);
      a1 = _mm512_fmadd_ps(p0, load16_i8_f32(row + 16), a1);
      a2 = _mm512_fmadd_ps(p1, load16_i8_f32(row + 32), a2);
      a3 = _mm512_fmadd_ps(p1, load16_i8_f32(row + 48), a3);
    }
    _mm512_storeu_ps(out + d, a0);
    _mm512_storeu_ps(out + d + 16, a1);
    _mm512_storeu_ps(out + d + 32, a2);
    _mm512_storeu_ps(out + d + 48, a3);
  }
  for (; d < hd; d += 32) {  // a last single block
    __m512 a0 = _mm512_loadu_ps(out + d), a1 = _mm512_loadu_ps(out + d + 16);
    const int8_t* row = vq + d;
    const uint16_t* sc = vs + d / 32;
    for (int j = 0; j < n; ++j, row += v_stride, sc += s_stride) {
      const __m512 p0 = _mm512_set1_ps(p[j] * _cvtsh_ss(sc[0]));
      a0 = _mm512_fmadd_ps(p0, load16_i8_f32(row), a0);
      a1 = _mm512_fmadd_ps(p0, load16_i8_f32(row + 16), a1);
    }
    _mm512_storeu_ps(out + d, a0);
    _mm512_storeu_ps(out + d + 16, a1);
  }
}

}  // namespace ctx::attn
