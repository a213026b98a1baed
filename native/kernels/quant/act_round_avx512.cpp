// AVX-512 activation rounding (quant.h round_row_f16 / round_row_bf16), 16
// lanes, the tail masked.
#include <immintrin.h>

#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

namespace {

__mmask16 tail_mask(int left) { return static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1); }

__m512 round_f16(__m512 v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }

// round_bits_bf16 on 16 lanes.
__m512i round_bf16(__m512i u) {
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  const __m512i r = _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

}  // namespace

void round_row_f16_avx512(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, round_f16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void round_row_bf16_avx512(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_epi32(y + i, m, round_bf16(_mm512_maskz_loadu_epi32(m, x + i)));
  }
}

}  // namespace ctx::qk
