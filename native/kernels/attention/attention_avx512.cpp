#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention/attention.h"

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

// Scores of G heads (q: G rows of hd) against one K block, 16 keys a
// register. Head g's register (g, r) holds its partial sums over d = r
// (mod 16), in the order of attention.h; the 16 registers of a head are made
// R at a time (G * R <= 16 live accumulators), so each K row is loaded and
// widened once for all G heads. key(d, j0, m) gives dimension d of keys j0..
// (lanes outside m zero).
template <int G, typename Key>
void score_keys(const float* q, int hd, int n, float scale, float* scores, int score_stride, Key key) {
  constexpr int R = 16 / G;
  for (int j0 = 0; j0 < n; j0 += 16) {
    const __mmask16 m = first(n - j0);
    alignas(64) __m512 part[G][16];
    for (int rb = 0; rb < 16; rb += R) {
      const int nr = std::min(R, 16 - rb);
      __m512 acc[G][R];
#pragma GCC unroll 16
      for (int i = 0; i < G * R; ++i) acc[i / R][i % R] = _mm512_setzero_ps();
      for (int d0 = rb; d0 < hd; d0 += 16)
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          if (r >= nr) break;
          const __m512 k = key(d0 + r, j0, m);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g)
            acc[g][r] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + d0 + r]), k, acc[g][r]);
        }
#pragma GCC unroll 16
      for (int i = 0; i < G * R; ++i)
        if (i % R < nr) part[i / R][rb + i % R] = acc[i / R][i % R];
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
      _mm512_mask_storeu_ps(scores + g * score_stride + j0, m, _mm512_mul_ps(fold16(part[g]), _mm512_set1_ps(scale)));
  }
}

// f(std::integral_constant<int, G>{}) for a group of g heads (1..kMaxGroup).
template <typename F>
void with_group(int g, F f) {
  switch (g) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

template <typename Key>
void score_heads(const float* q, int g, int hd, int n, float scale, float* scores, int score_stride, Key key) {
  with_group(g, [&](auto G) { score_keys<decltype(G)::value>(q, hd, n, scale, scores, score_stride, key); });
}

void scores_avx512(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                   int score_stride) {
  score_heads(q, g, hd, n, scale, scores, score_stride, [&](int d, int j0, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kt + static_cast<size_t>(d) * stride + j0));
  });
}

void scores_q8_avx512(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                      float scale, float* scores, int score_stride) {
  score_heads(q, g, hd, n, scale, scores, score_stride, [&](int d, int j0, __mmask16 m) {
    const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, ks + static_cast<size_t>(d / 32) * stride + j0));
    const __m512 k = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, kq + static_cast<size_t>(d) * stride + j0)));
    return _mm512_mul_ps(s, k);
  });
}

// The weighted sum of V for G heads (p: G rows of weights, p_stride apart;
// out: G rows of hd), 16 values of the output a register. Head g's register
// (g, j) holds its partial sums over the keys in slot j of every page (pages
// of 16 keys: slot = key % 16), made R slots at a time so each V row is
// loaded and widened once for all G heads. value(i, j, d0) gives values
// d0..d0+15 of slot j of page i; weight(g, i, j, d0) the weight that meets them.
template <int G, typename Value, typename Weight>
void accumulate_heads(int n, int hd, float* out, Value value, Weight weight) {
  constexpr int R = 16 / G;
  for (int d0 = 0; d0 < hd; d0 += 16) {
    alignas(64) __m512 part[G][16];
    for (int jb = 0; jb < 16; jb += R) {
      const int nr = std::min(R, 16 - jb);
      __m512 acc[G][R];
#pragma GCC unroll 16
      for (int i = 0; i < G * R; ++i) acc[i / R][i % R] = _mm512_setzero_ps();
      for (int i = 0; i * 16 < n; ++i) {
        const int nj = n - i * 16;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int j = jb + r;
          if (r >= nr || j >= nj) break;
          const __m512 v = value(i, j, d0);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[g][r] = _mm512_fmadd_ps(_mm512_set1_ps(weight(g, i, j, d0)), v, acc[g][r]);
        }
      }
#pragma GCC unroll 16
      for (int i = 0; i < G * R; ++i)
        if (i % R < nr) part[i / R][jb + i % R] = acc[i / R][i % R];
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(out + g * hd + d0, fold16(part[g]));
  }
}

template <typename Value, typename Weight>
void accumulate_group(int g, int n, int hd, float* out, Value value, Weight weight) {
  with_group(g, [&](auto G) { accumulate_heads<decltype(G)::value>(n, hd, out, value, weight); });
}

void accumulate_avx512(const float* p, int p_stride, int g, const uint16_t* const* pages, int /*pt: 16*/,
                       int v_stride, int n, int hd, float* out) {
  accumulate_group(
      g, n, hd, out,
      [&](int i, int j, int d0) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pages[i] + d0 + j * v_stride)));
      },
      [&](int h, int i, int j, int) { return p[h * p_stride + i * 16 + j]; });
}

void accumulate_q8_avx512(const float* p, int p_stride, int g, const int8_t* const* pages,
                          const uint16_t* const* scales, int /*pt: 16*/, int v_stride, int s_stride, int n, int hd,
                          float* out) {
  // The q8 weight is p times the scale of the value's block of 32 (attention.h).
  accumulate_group(
      g, n, hd, out, [&](int i, int j, int d0) { return load16_i8_f32(pages[i] + d0 + j * v_stride); },
      [&](int h, int i, int j, int d0) {
        return p[h * p_stride + i * 16 + j] * _cvtsh_ss(scales[i][j * s_stride + d0 / 32]);
      });
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
