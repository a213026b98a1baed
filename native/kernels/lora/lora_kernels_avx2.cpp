// AVX2 form of lora::up (kernels/lora/lora_kernels.h): 8 outputs, one per lane;
// a last partial group goes through a padded copy.
#include <immintrin.h>

#include <algorithm>

#include "kernels/lora/lora_kernels.h"

namespace ctx::lora {

void up_avx2(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  const __m256 f = _mm256_set1_ps(factor);
  for (int r = 0; r < n_x; ++r) {
    const float* tr = t + static_cast<size_t>(r) * rank;
    float* yr = y + r * y_stride;
    for (int o = o0; o < o1; o += 8) {
      const int n = std::min(8, o1 - o);
      __m256 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm256_setzero_ps();
      for (int j = 0; j < rank; ++j) {
        const float* b = bt + static_cast<size_t>(j) * n_out + o;
        __m256 bv;
        if (n == 8) {
          bv = _mm256_loadu_ps(b);
        } else {
          alignas(32) float pad[8] = {};
          std::copy(b, b + n, pad);
          bv = _mm256_load_ps(pad);
        }
        acc[j % 16] = _mm256_fmadd_ps(bv, _mm256_set1_ps(tr[j]), acc[j % 16]);
      }
      for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) acc[i] = _mm256_add_ps(acc[i], acc[i + w]);
      if (n == 8) {
        _mm256_storeu_ps(yr + o, _mm256_add_ps(_mm256_loadu_ps(yr + o), _mm256_mul_ps(f, acc[0])));
      } else {
        alignas(32) float out[8];
        _mm256_store_ps(out, acc[0]);
        for (int i = 0; i < n; ++i) yr[o + i] = yr[o + i] + factor * out[i];
      }
    }
  }
}

}  // namespace ctx::lora
