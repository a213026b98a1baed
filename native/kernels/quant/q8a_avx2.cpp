// quantize_row_q8a on 8 lanes: the AVX-512 file's steps (q8a_avx512.cpp), the
// same bytes as the scalar definition.
#include <immintrin.h>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

void quantize_row_q8a_avx2(const float* x, BlockQ8A* y, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int b = 0; b < n / QK; ++b, x += QK) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
    }
    const float amax = hmax8_ps(m);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    // int32 -> int8 (no saturation reached: |q| <= 127); the packs interleave
    // the 128-bit lanes, the permute puts the dwords back in element order.
    const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i q8 = _mm256_permutevar8x32_epi32(q16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), q8);
    const int sum = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    const float d = amax / 127.0f;
    y[b].s = f16_to_f32_hw(f32_to_f16_hw(d * static_cast<float>(sum)));
    y[b].d = f16_to_f32_hw(f32_to_f16_hw(d));
  }
}

}  // namespace ctx::qk
