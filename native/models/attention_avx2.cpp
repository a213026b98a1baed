#include <immintrin.h>

#include <cstring>

#include "models/attention.h"

namespace ctx::attn {

void scores_avx2(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int lanes = n - j0 < 8 ? n - j0 : 8;
    __m256 acc = _mm256_setzero_ps();
    const uint16_t* k = kt + j0;
    for (int d = 0; d < hd; ++d, k += stride) {
      __m128i raw;
      if (lanes == 8) {
        raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k));
      } else {
        alignas(16) uint16_t tmp[8] = {0};
        std::memcpy(tmp, k, sizeof(uint16_t) * lanes);
        raw = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_cvtph_ps(raw), acc);
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_mul_ps(acc, _mm256_set1_ps(scale)));
    std::memcpy(scores + j0, out, sizeof(float) * lanes);
  }
}

}  // namespace ctx::attn
