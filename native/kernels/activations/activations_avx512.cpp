#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/activations/activations_impl.h"

namespace ctx::act {

namespace {

// 16 lanes of exp_canonical: the same operations, lane by lane (this is
// ggml_v_expf's AVX-512 form, scalef included).
inline __m512 exp16(__m512 x) {
  const __m512 r = _mm512_set1_ps(kShift);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), r);
  const __m512 n = _mm512_sub_ps(z, r);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(kC5), b, _mm512_set1_ps(kC4)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(kC3), b, _mm512_set1_ps(kC2))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(kC1), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, n);
  const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                          _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(d, res, alt);
}

float hsum16(__m512 v) {
  alignas(64) float a[16];
  _mm512_store_ps(a, v);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

}  // namespace

double exp_shift_sum_avx512(float* x, int n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  double sum = 0.0;
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    // Lanes past n are zero in the chunk's sum, as llama.cpp's masked padding is.
    const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum += static_cast<double>(hsum16(e));
  }
  return sum;
}

void silu_mul_avx512(float* g, const float* u, int n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

void gelu_mul_avx512(float* g, const float* u, int n, const uint16_t* table) {
  const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    // table[f16(x)]: 32 bits gathered at each entry (the table is padded), the low 16 kept.
    const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m512 t = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(h, table, 2)));
    // x >= 10 gives x, x <= -10 gives 0 (NaN takes the table's entry, as the scalar path does).
    const __m512 y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLE_UQ),
                                         _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), t, x));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

void rope_avx512(float* v, int n_heads, int hd, int half, bool neox, const float* cs) {
  // Interleaved pairs: the even lanes of two registers are x0, the odd ones x1.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  auto first = [](int n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max(n, 0)) - 1); };
  for (int h = 0; h < n_heads; ++h, v += hd)
    for (int i = 0; i < half; i += 16) {
      const int np = std::min(16, half - i);  // pairs this step
      const __mmask16 m = first(np), m0 = first(2 * np), m1 = first(2 * np - 16);
      const __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, cs + half + i);
      __m512 x0, x1;
      if (neox) {
        x0 = _mm512_maskz_loadu_ps(m, v + i);
        x1 = _mm512_maskz_loadu_ps(m, v + half + i);
      } else {
        const __m512 p0 = _mm512_maskz_loadu_ps(m0, v + 2 * i), p1 = _mm512_maskz_loadu_ps(m1, v + 2 * i + 16);
        x0 = _mm512_permutex2var_ps(p0, even, p1);
        x1 = _mm512_permutex2var_ps(p0, odd, p1);
      }
      // fmsub(x0, c, p) is fma(x0, c, -p) exactly, signed zeros included.
      const __m512 a = _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s));
      const __m512 b = _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c));
      if (neox) {
        _mm512_mask_storeu_ps(v + i, m, a);
        _mm512_mask_storeu_ps(v + half + i, m, b);
      } else {
        _mm512_mask_storeu_ps(v + 2 * i, m0, _mm512_permutex2var_ps(a, lo, b));
        _mm512_mask_storeu_ps(v + 2 * i + 16, m1, _mm512_permutex2var_ps(a, hi, b));
      }
    }
}

}  // namespace ctx::act
