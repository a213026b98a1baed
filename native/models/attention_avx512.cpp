#include <immintrin.h>

#include "models/attention.h"

namespace ctx::attn {

void scores_avx512(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int lanes = n - j0 < 16 ? n - j0 : 16;
    const __mmask16 m = static_cast<__mmask16>((1u << lanes) - 1);
    __m512 acc = _mm512_setzero_ps();
    const uint16_t* k = kt + j0;
    for (int d = 0; d < hd; ++d, k += stride) {
      const __m512 kv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k));
      acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), kv, acc);
    }
    _mm512_mask_storeu_ps(scores + j0, m, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
  }
}

}  // namespace ctx::attn
