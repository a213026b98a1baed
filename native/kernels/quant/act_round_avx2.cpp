// AVX2 activation rounding (quant.h round_row_f16 / round_row_bf16), 8 lanes;
// the tail through the scalar path's functions, the same bits.
#include <immintrin.h>

#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

void round_row_f16_avx2(const float* x, float* y, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
  round_row_f16_scalar(x + i, y + i, n - i);
}

// round_bits_bf16 on 8 lanes. The magnitude compare is signed, exact for
// values below 2^31; the sums wrap as uint32 does.
void round_row_bf16_avx2(const float* x, float* y, int n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)), quiet = _mm256_set1_epi32(0x00400000);
  const __m256i half = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(half, odd));
    const __m256i r = _mm256_and_si256(_mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan), high);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), r);
  }
  round_row_bf16_scalar(x + i, y + i, n - i);
}

}  // namespace ctx::qk
