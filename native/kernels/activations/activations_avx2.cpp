// Elementwise kernels on AVX2 (activations_simd.h): 8 lanes a ymm.
#include <immintrin.h>

#include <cmath>

#include "kernels/activations/activations_simd.h"

namespace ctx::act {

namespace {

inline __m256 pow2(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); }

struct Avx2 : F32x8 {
  struct Sums {
    __m256d lo, hi;  // rows 0-3, 4-7
  };
  static Sums sums_zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static void add_squares(Sums& s, __m256 sq) {
    s.lo = _mm256_add_pd(s.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s.hi = _mm256_add_pd(s.hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  static void store_sums(const Sums& s, double* out) {
    _mm256_store_pd(out, s.lo);
    _mm256_store_pd(out + 4, s.hi);
  }
  // 8 lanes of exp_canonical: the same operations, lane by lane; AVX2 has no
  // scalef, so j * 2^n is built as exp_canonical's scale2 builds it.
  static __m256 exp(__m256 x) {
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

  // table[f16(x)]: 32 bits gathered at each entry (the table is padded), the
  // low 16 kept; x >= 10 gives x, x <= -10 gives 0 (NaN takes the table's
  // entry, as the scalar path does).
  static __m256 gelu(__m256 x, const uint16_t* table) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m256i w = _mm256_and_si256(_mm256_i32gather_epi32(reinterpret_cast<const int*>(table), h, 2),
                                       _mm256_set1_epi32(0xFFFF));
    const __m256 t = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_NLE_UQ),
                         _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ)));
  }
};

}  // namespace

double exp_shift_sum_avx2(float* x, int n, float shift) { return exp_shift_sum_simd<Avx2>(x, n, shift); }

void silu_mul_avx2(float* g, const float* u, int n) { silu_mul_simd<Avx2>(g, u, n); }

void rmsnorm_rows_avx2(const float* x, const float* w, float* out, int n_rows, int n, float eps) {
  rmsnorm_rows_simd<Avx2>(x, w, out, n_rows, n, eps);
}

void gelu_mul_avx2(float* g, const float* u, int n, const uint16_t* table) { gelu_mul_simd<Avx2>(g, u, n, table); }

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
