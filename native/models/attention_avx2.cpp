#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "models/attention.h"

namespace ctx::attn {

void scores_avx2(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int lanes = n - j0 < 8 ? n - j0 : 8;
    __m256 acc = _mm256_setzero_ps();
    const uint16_t* k = kt + j0;
    for (int d = 0; d < hd; ++d, k += stride) {
      __m128i raw;
      if (lanes == 8) {
        raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k));
      } else {
        alignas(16) uint16_t tmp[8] = {0};
        std::memcpy(tmp, k, sizeof(uint16_t) * lanes);
        raw = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_cvtph_ps(raw), acc);
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_mul_ps(acc, _mm256_set1_ps(scale)));
    std::memcpy(scores + j0, out, sizeof(float) * lanes);
  }
}

float max_avx2(const float* x, int n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = lanes[0];
  for (int j = 1; j < 8; ++j) r = std::fmax(r, lanes[j]);
  for (; i < n; ++i) r = std::fmax(r, x[i]);
  return r;
}

void scale_round_avx2(float* x, int n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  if (i < n) {
    alignas(32) float tmp[8] = {0};
    std::memcpy(tmp, x + i, sizeof(float) * (n - i));
    const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_load_ps(tmp), s), _MM_FROUND_TO_NEAREST_INT);
    _mm256_store_ps(tmp, _mm256_cvtph_ps(h));
    std::memcpy(x + i, tmp, sizeof(float) * (n - i));
  }
}

void accumulate_avx2(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out) {
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a0 = _mm256_loadu_ps(out + d), a1 = _mm256_loadu_ps(out + d + 8);
    __m256 a2 = _mm256_loadu_ps(out + d + 16), a3 = _mm256_loadu_ps(out + d + 24);
    const uint16_t* row = v + d;
    for (int j = 0; j < n; ++j, row += v_stride) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      a0 = _mm256_fmadd_ps(pj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row))), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8))), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16))), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 24))), a3);
    }
    _mm256_storeu_ps(out + d, a0);
    _mm256_storeu_ps(out + d + 8, a1);
    _mm256_storeu_ps(out + d + 16, a2);
    _mm256_storeu_ps(out + d + 24, a3);
  }
  for (; d < hd; ++d)  // head dims that are not a multiple of 32: same fma chain per element
    for (int j = 0; j < n; ++j) {
      alignas(16) uint16_t h[8] = {v[static_cast<size_t>(j) * v_stride + d]};
      alignas(32) float f[8];
      _mm256_store_ps(f, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))));
      out[d] = std::fma(p[j], f[0], out[d]);
    }
}

// q8: 8 keys at a time; partial groups go through a zero-padded copy.
static __m256 load8_i8_f32(const int8_t* p, int lanes) {
  __m128i raw;
  if (lanes == 8) {
    raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  } else {
    alignas(16) int8_t tmp[16] = {0};
    std::memcpy(tmp, p, lanes);
    raw = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
}

static __m256 load8_f16_f32(const uint16_t* p, int lanes) {
  if (lanes == 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t tmp[8] = {0};
  std::memcpy(tmp, p, sizeof(uint16_t) * lanes);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

void scores_q8_avx2(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores) {
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int lanes = n - j0 < 8 ? n - j0 : 8;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < hd / 32; ++b) {
      const __m256 s = load8_f16_f32(ks + static_cast<size_t>(b) * stride + j0, lanes);
      const int8_t* k = kq + static_cast<size_t>(b) * 32 * stride + j0;
      for (int d = b * 32; d < b * 32 + 32; ++d, k += stride)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_mul_ps(s, load8_i8_f32(k, lanes)), acc);
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_mul_ps(acc, _mm256_set1_ps(scale)));
    std::memcpy(scores + j0, out, sizeof(float) * lanes);
  }
}

void accumulate_q8_avx2(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride, int n,
                        int hd, float* out) {
  for (int d = 0; d < hd; d += 32) {  // one scale block in four registers
    __m256 a0 = _mm256_loadu_ps(out + d), a1 = _mm256_loadu_ps(out + d + 8);
    __m256 a2 = _mm256_loadu_ps(out + d + 16), a3 = _mm256_loadu_ps(out + d + 24);
    const int8_t* row = vq + d;
    const uint16_t* sc = vs + d / 32;
    for (int j = 0; j < n; ++j, row += v_stride, sc += s_stride) {
      const __m256 pd = _mm256_set1_ps(p[j] * _cvtsh_ss(*sc));
      a0 = _mm256_fmadd_ps(pd, load8_i8_f32(row, 8), a0);
      a1 = _mm256_fmadd_ps(pd, load8_i8_f32(row + 8, 8), a1);
      a2 = _mm256_fmadd_ps(pd, load8_i8_f32(row + 16, 8), a2);
      a3 = _mm256_fmadd_ps(pd, load8_i8_f32(row + 24, 8), a3);
    }
    _mm256_storeu_ps(out + d, a0);
    _mm256_storeu_ps(out + d + 8, a1);
    _mm256_storeu_ps(out + d + 16, a2);
    _mm256_storeu_ps(out + d + 24, a3);
  }
}

}  // namespace ctx::attn
