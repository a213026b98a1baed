#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/attention/attention.h"

namespace ctx::attn {

namespace {

// AVX2 has 16 registers, too few for 16 partial sums plus operands, so the
// 16 sums of attention.h are computed as two sets of 8 (0-7, then 8-15) and
// folded: the first fold step (acc[i] + acc[i + 8]) joins the two sets.
inline __m256 fold(__m256* lo, const __m256* hi) {
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) lo[i] = _mm256_add_ps(lo[i], hi[i]);
#pragma GCC unroll 3
  for (int w = 4; w >= 1; w /= 2)
#pragma GCC unroll 4
    for (int i = 0; i < w; ++i) lo[i] = _mm256_add_ps(lo[i], lo[i + w]);
  return lo[0];
}

inline __m256 load8_f16(const uint16_t* p, int lanes) {
  if (lanes >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t tmp[8] = {0};
  std::memcpy(tmp, p, sizeof(uint16_t) * lanes);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

inline __m256 load8_i8(const int8_t* p, int lanes) {
  int64_t raw = 0;
  std::memcpy(&raw, p, lanes >= 8 ? 8 : lanes);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(raw)));
}

void store8(float* dst, __m256 v, int lanes) {
  alignas(32) float out[8];
  _mm256_store_ps(out, v);
  std::memcpy(dst, out, sizeof(float) * (lanes >= 8 ? 8 : lanes));
}

// Partial sums r0..r0+7 (d = r mod 16) of the scores of 8 keys.
template <typename LoadK>
void score_sums(const float* q, int hd, int r0, LoadK load_k, __m256* acc) {
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  for (int d0 = 0; d0 < hd; d0 += 16)
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(q[d0 + r0 + r]), load_k(d0 + r0 + r), acc[r]);
}

void scores_head(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int lanes = n - j0;
    auto load_k = [&](int d) { return load8_f16(kt + static_cast<size_t>(d) * stride + j0, lanes); };
    __m256 lo[8], hi[8];
    score_sums(q, hd, 0, load_k, lo);
    score_sums(q, hd, 8, load_k, hi);
    store8(scores + j0, _mm256_mul_ps(fold(lo, hi), _mm256_set1_ps(scale)), lanes);
  }
}

void scores_q8_head(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores) {
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int lanes = n - j0;
    auto load_k = [&](int d) {
      const __m256 s = load8_f16(ks + static_cast<size_t>(d / 32) * stride + j0, lanes);
      return _mm256_mul_ps(s, load8_i8(kq + static_cast<size_t>(d) * stride + j0, lanes));
    };
    __m256 lo[8], hi[8];
    score_sums(q, hd, 0, load_k, lo);
    score_sums(q, hd, 8, load_k, hi);
    store8(scores + j0, _mm256_mul_ps(fold(lo, hi), _mm256_set1_ps(scale)), lanes);
  }
}

// Partial sums over the keys in slots j0..j0+7 of every page, for 8 values.
template <typename Term>
void value_sums(int n, int j0, Term term, __m256* acc) {
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int i = 0; i * 16 < n; ++i) {
    const int nj = n - i * 16 - j0;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      if (j < nj) acc[j] = term(i, j0 + j, acc[j]);
  }
}

void accumulate_head(const float* p, const uint16_t* const* pages, int v_stride, int n, int hd, float* out) {
  for (int d0 = 0; d0 < hd; d0 += 8) {
    auto term = [&](int i, int j, __m256 acc) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pages[i] + d0 + j * v_stride)));
      return _mm256_fmadd_ps(_mm256_set1_ps(p[i * 16 + j]), v, acc);
    };
    __m256 lo[8], hi[8];
    value_sums(n, 0, term, lo);
    value_sums(n, 8, term, hi);
    _mm256_storeu_ps(out + d0, fold(lo, hi));
  }
}

void accumulate_q8_head(const float* p, const int8_t* const* pages, const uint16_t* const* scales, int v_stride,
                        int s_stride, int n, int hd, float* out) {
  for (int d0 = 0; d0 < hd; d0 += 8) {
    auto term = [&](int i, int j, __m256 acc) {
      const float pw = p[i * 16 + j] * _cvtsh_ss(scales[i][j * s_stride + d0 / 32]);
      return _mm256_fmadd_ps(_mm256_set1_ps(pw), load8_i8(pages[i] + d0 + j * v_stride, 8), acc);
    };
    __m256 lo[8], hi[8];
    value_sums(n, 0, term, lo);
    value_sums(n, 8, term, hi);
    _mm256_storeu_ps(out + d0, fold(lo, hi));
  }
}

}  // namespace

// A group on this path is its heads one by one (16 registers hold one head's sums).
void scores_avx2(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                 int score_stride) {
  for (int h = 0; h < g; ++h, q += hd, scores += score_stride) scores_head(q, kt, hd, stride, n, scale, scores);
}

void scores_q8_avx2(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                    float scale, float* scores, int score_stride) {
  for (int h = 0; h < g; ++h, q += hd, scores += score_stride) scores_q8_head(q, kq, ks, hd, stride, n, scale, scores);
}

void accumulate_avx2(const float* p, int p_stride, int g, const uint16_t* const* pages, int /*pt: 16*/, int v_stride,
                     int n, int hd, float* out) {
  for (int h = 0; h < g; ++h, p += p_stride, out += hd) accumulate_head(p, pages, v_stride, n, hd, out);
}

void accumulate_q8_avx2(const float* p, int p_stride, int g, const int8_t* const* pages, const uint16_t* const* scales,
                        int /*pt: 16*/, int v_stride, int s_stride, int n, int hd, float* out) {
  for (int h = 0; h < g; ++h, p += p_stride, out += hd) accumulate_q8_head(p, pages, scales, v_stride, s_stride, n, hd, out);
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

}  // namespace ctx::attn
