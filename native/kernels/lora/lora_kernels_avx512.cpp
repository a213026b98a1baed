// AVX-512 form of lora::up (kernels/lora/lora_kernels.h): 16 outputs, one per lane.
#include <immintrin.h>

#include "kernels/lora/lora_kernels.h"

namespace ctx::lora {

void up_avx512(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
               size_t y_stride) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int r = 0; r < n_x; ++r) {
    const float* tr = t + static_cast<size_t>(r) * rank;
    float* yr = y + r * y_stride;
    for (int o = o0; o < o1; o += 16) {
      const __mmask16 k = o1 - o >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (o1 - o)) - 1);
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      for (int j = 0; j < rank; ++j)
        acc[j % 16] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, bt + static_cast<size_t>(j) * n_out + o),
                                      _mm512_set1_ps(tr[j]), acc[j % 16]);
      for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) acc[i] = _mm512_add_ps(acc[i], acc[i + w]);
      const __m512 yv = _mm512_maskz_loadu_ps(k, yr + o);
      _mm512_mask_storeu_ps(yr + o, k, _mm512_add_ps(yv, _mm512_mul_ps(f, acc[0])));
    }
  }
}

}  // namespace ctx::lora
