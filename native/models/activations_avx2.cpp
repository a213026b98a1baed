#include <immintrin.h>

#include "models/activations_impl.h"

namespace ctx::act {

namespace {

// 8 lanes of exp_canonical: the same operations, lane by lane.
inline __m256 exp8(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kMinX), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMinX)), _mm256_set1_ps(kMaxX));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(under, y);
}

}  // namespace

float exp_shift_sum_avx2(float* x, int n, float shift) {
  // Two registers are the 16 canonical lanes: lo = lanes 0-7, hi = 8-15.
  const __m256 s = _mm256_set1_ps(shift);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    const __m256 b = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), s));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, lo);
  _mm256_store_ps(acc + 8, hi);
  alignas(32) float tail[16] = {0};
  for (int j = 0; i + j < n; ++j) tail[j] = x[i + j] - shift;
  if (i < n) {
    const __m256 a = exp8(_mm256_load_ps(tail));
    const __m256 b = exp8(_mm256_load_ps(tail + 8));
    _mm256_store_ps(tail, a);
    _mm256_store_ps(tail + 8, b);
    for (int j = 0; i + j < n; ++j) {
      x[i + j] = tail[j];
      acc[j] = acc[j] + tail[j];
    }
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] = acc[k] + acc[k + w];
  return acc[0];
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

}  // namespace ctx::act
