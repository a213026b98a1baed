// AVX-512 (VNNI) K-quant kernels: kquant_simd.h with vpdpwssd folding the
// scale multiply and the add, and wider tiles in the 32 vector registers.
#define KQ_VNNI 1
#include "kernels/quant/kquant_simd.h"

#include <cstring>

namespace ctx::qk {

// quantize_row_q8k on 16 lanes, byte for byte the scalar definition: the max
// is exact, the first element of largest |x| is found by a compare, the
// product iscale * x rounds the same, vcvtps2dq rounds half to even as
// nearbyint does, and the group sums are exact integers.
void quantize_row_q8k_avx512(const float* x, BlockQ8K* y, int n) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int b = 0; b < n / QK_K; ++b, x += QK_K) {
    BlockQ8K& out = y[b];
    __m512 vmax = _mm512_setzero_ps();
    for (int j = 0; j < QK_K; j += 16) vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask));
    const float amax = _mm512_reduce_max_ps(vmax);
    if (amax == 0.0f) {
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    int first = 0;
    for (int j = 0; j < QK_K; j += 16) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        first = j + __builtin_ctz(hit);
        break;
      }
    }
    const float iscale = -127.0f / x[first];
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int g = 0; g < QK_K / 16; ++g) {
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g))), _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + 16 * g), _mm512_cvtsepi32_epi8(q));
      out.bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    out.d = 1.0f / iscale;
  }
}

void matmul_k_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                     size_t y_stride) {
  // 16 weight rows a vector beat a pair's horizontal sums from 2 activation
  // rows on in cache (Q4_K: 2x there, 4x for prefill; Q6_K: 1.5x, 3x on Zen
  // 4); streamed from memory, from 4 (quant_impl.h): at 2 and 3 rows the row
  // path ran Gemma 3's batched decode 1.07x and 1.04x, at 4 alike (Zen 4,
  // session 42).
  if ((t == DType::Q4_K || t == DType::Q6_K) && n_x >= kKTilesFromRows)
    return matmul_ktiles_avx512(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
  matmul_k_dispatch(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
