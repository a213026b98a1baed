// quantize_row_q8a on 16 lanes (quant.h's BlockQ8A numerics), byte for byte
// the scalar definition: the max of |x| is exact in any order, id * x rounds
// the same per element, vcvtps2dq rounds half to even as round_half_even
// does (|id * x| <= 127 here), and the block's sum of qs is an exact integer.
// The f16 roundings of d and s are the scalar ones, one F16C conversion each.
#include <immintrin.h>

#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

void quantize_row_q8a_avx512(const float* x, BlockQ8A* y, int n) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int b = 0; b < n / QK; ++b, x += QK) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, abs_mask), _mm512_and_ps(hi, abs_mask)));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(id)));
    const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs), _mm512_cvtepi32_epi8(q_lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16), _mm512_cvtepi32_epi8(q_hi));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
    const float d = amax / 127.0f;
    y[b].s = f16_to_f32_hw(f32_to_f16_hw(d * static_cast<float>(sum)));
    y[b].d = f16_to_f32_hw(f32_to_f16_hw(d));
  }
}

}  // namespace ctx::qk
