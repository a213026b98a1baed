// Elementwise kernels on AVX-512 (activations_simd.h): 16 lanes a zmm; the
// exp is ggml_v_expf's AVX-512 form, scalef included.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/activations/activations_simd.h"

namespace ctx::act {

namespace {

struct Avx512 : F32x16 {
  using Sums = __m512d;  // rows 0-7
  static Sums sums_zero() { return _mm512_setzero_pd(); }
  static void add_squares(Sums& s, __m256 sq) { s = _mm512_add_pd(s, _mm512_cvtps_pd(sq)); }
  static void store_sums(const Sums& s, double* out) { _mm512_store_pd(out, s); }
  // 16 lanes of exp_canonical: the same operations, lane by lane.
  static __m512 exp(__m512 x) {
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

  // table[f16(x)]: 32 bits gathered at each entry (the table is padded), the
  // low 16 kept; x >= 10 gives x, x <= -10 gives 0 (NaN takes the table's
  // entry, as the scalar path does).
  static __m512 gelu(__m512 x, const uint16_t* table) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m512 t = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(h, table, 2)));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-10.0f), _CMP_NLE_UQ),
                               _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(10.0f), _CMP_GE_OQ), t, x));
  }
};

}  // namespace

double exp_shift_sum_avx512(float* x, int n, float shift) { return exp_shift_sum_simd<Avx512>(x, n, shift); }

void silu_mul_avx512(float* g, const float* u, int n) { silu_mul_simd<Avx512>(g, u, n); }

void rmsnorm_rows_avx512(const float* x, const float* w, float* out, int n_rows, int n, float eps) {
  rmsnorm_rows_simd<Avx512>(x, w, out, n_rows, n, eps);
}

void gelu_mul_avx512(float* g, const float* u, int n, const uint16_t* table) { gelu_mul_simd<Avx512>(g, u, n, table); }

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
