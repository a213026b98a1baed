#include <immintrin.h>

#include <cmath>

#include "kernels/activations/activations_impl.h"

namespace ctx::act {

namespace {

// 8 lanes of exp_canonical: the same operations, lane by lane; AVX2 has no
// scalef, so j * 2^n is built as exp_canonical's scale2 builds it.
inline __m256 pow2(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); }

inline __m256 exp8(__m256 x) {
  const __m256 r = _mm256_set1_ps(kShift);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kC5), b, _mm256_set1_ps(kC4)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(kC3), b, _mm256_set1_ps(kC2))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(kC1), b, _mm256_set1_ps(1.0f)));
  // n clamped to [-192, 192] so the exponent arithmetic stays in range; lanes
  // beyond are replaced below.
  const __m256i ni = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-192)), _mm256_set1_ps(192)));
  const __m256i lo = _mm256_set1_epi32(-126), hi = _mm256_set1_epi32(127);
  const __m256 normal = _mm256_mul_ps(j, pow2(_mm256_min_epi32(_mm256_max_epi32(ni, lo), hi)));
  const __m256 under = _mm256_mul_ps(_mm256_mul_ps(j, pow2(_mm256_add_epi32(_mm256_max_epi32(ni, _mm256_set1_epi32(-192)),
                                                                           _mm256_set1_epi32(126)))),
                                     pow2(lo));
  const __m256 over = _mm256_mul_ps(_mm256_mul_ps(j, pow2(hi)), pow2(_mm256_sub_epi32(_mm256_min_epi32(ni, _mm256_set1_epi32(192)), hi)));
  __m256 res = _mm256_blendv_ps(normal, under, _mm256_castsi256_ps(_mm256_cmpgt_epi32(lo, ni)));
  res = _mm256_blendv_ps(res, over, _mm256_castsi256_ps(_mm256_cmpgt_epi32(ni, hi)));
  const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(192), _CMP_GT_OQ);
  const __m256 alt = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                      _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_blendv_ps(res, alt, big);
}

}  // namespace

double exp_shift_sum_avx2(float* x, int n, float shift) {
  // Two registers are one chunk of 16: lanes 0-7 and 8-15.
  double sum = 0.0;
  for (int i = 0; i < n; i += 16) {
    const int m = n - i < 16 ? n - i : 16;
    alignas(32) float c[16] = {0};
    for (int k = 0; k < m; ++k) c[k] = x[i + k] - shift;
    _mm256_store_ps(c, exp8(_mm256_load_ps(c)));
    _mm256_store_ps(c + 8, exp8(_mm256_load_ps(c + 8)));
    for (int k = 0; k < m; ++k) x[i + k] = c[k];
    for (int k = m; k < 16; ++k) c[k] = 0.0f;  // lanes past n count as zero
    for (int w = 8; w >= 1; w /= 2)
      for (int k = 0; k < w; ++k) c[k] = c[k] + c[k + w];
    sum += static_cast<double>(c[0]);
  }
  return sum;
}

void silu_mul_avx2(float* g, const float* u, int n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  alignas(32) float gx[8] = {0}, ux[8] = {0};
  const int rest = n - i;
  for (int j = 0; j < rest; ++j) {
    gx[j] = g[i + j];
    ux[j] = u[i + j];
  }
  if (rest > 0) {
    const __m256 x = _mm256_load_ps(gx);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_store_ps(gx, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_load_ps(ux)));
    for (int j = 0; j < rest; ++j) g[i + j] = gx[j];
  }
}

void gelu_mul_avx2(float* g, const float* u, int n, const uint16_t* table) {
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  const int* base = reinterpret_cast<const int*>(table);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    // table[f16(x)]: 32 bits gathered at each entry (the table is padded), the low 16 kept.
    const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m256i w = _mm256_and_si256(_mm256_i32gather_epi32(base, h, 2), _mm256_set1_epi32(0xFFFF));
    const __m256 t = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    // x >= 10 gives x, x <= -10 gives 0 (NaN takes the table's entry, as the scalar path does).
    const __m256 y = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_NLE_UQ),
                                   _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ)));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) {  // the scalar path's steps, with one F16C conversion each way
    const float x = g[i];
    const uint16_t h = static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
    const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : _cvtsh_ss(table[h]);
    g[i] = y * u[i];
  }
}

void rope_avx2(float* v, int n_heads, int hd, int half, bool neox, const float* cs) {
  for (int h = 0; h < n_heads; ++h, v += hd) {
    int i = 0;
    if (neox)
      for (; i + 8 <= half; i += 8) {
        const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(cs + half + i);
        const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + half + i);
        // fmsub(x0, c, p) is fma(x0, c, -p) exactly, signed zeros included.
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
        _mm256_storeu_ps(v + half + i, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
      }
    for (; i < half; ++i) {  // interleaved pairs, and the NeoX tail: the same two FMAs one pair at a time
      const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const __m128 c = _mm_set_ss(cs[i]), s = _mm_set_ss(cs[half + i]), x0 = _mm_set_ss(v[a]), x1 = _mm_set_ss(v[b]);
      v[a] = _mm_cvtss_f32(_mm_fmsub_ss(x0, c, _mm_mul_ss(x1, s)));
      v[b] = _mm_cvtss_f32(_mm_fmadd_ss(x0, s, _mm_mul_ss(x1, c)));
    }
  }
}

}  // namespace ctx::act
