// AVX2 K-quant kernels: kquant_simd.h with vpmaddwd + vpaddd for the scales.
#define KQ_VNNI 0
#include "kernels/quant/kquant_simd.h"

#include <cstring>

namespace ctx::qk {

// quantize_row_q8k on 8 lanes, byte for byte the scalar definition, as
// kquant_avx512.cpp's on 16: the max is exact, the first element of largest
// |x| is found by a compare, the product iscale * x rounds the same,
// vcvtps2dq rounds half to even as nearbyint does, and the group sums are
// exact integers.
void quantize_row_q8k_avx2(const float* x, BlockQ8K* y, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int b = 0; b < n / QK_K; ++b, x += QK_K) {
    BlockQ8K& out = y[b];
    __m256 vmax = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
    const float amax = hmax8_ps(vmax);
    if (amax == 0.0f) {
      std::memset(&out, 0, sizeof(out));
      continue;
    }
    int first = 0;
    for (int j = 0; j < QK_K; j += 8) {
      const int hit = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (hit) {
        first = j + __builtin_ctz(hit);
        break;
      }
    }
    const float iscale = -127.0f / x[first];
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127);
    for (int g = 0; g < QK_K / 16; ++g) {
      const __m256i lo = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 16 * g))), top);
      const __m256i hi = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 16 * g + 8))), top);
      // int32 -> int16 -> int8 with signed saturation (the values are within -127..127), lanes back in order
      const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
      const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.qs + 16 * g), bytes);
      out.bsums[g] = static_cast<int16_t>(hsum8_epi32(_mm256_add_epi32(lo, hi)));
    }
    out.d = 1.0f / iscale;
  }
}

void matmul_k_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                   size_t y_stride) {
  // 8 weight rows a vector beat a pair's horizontal sums for 2 or more activation rows in cache (as in the
  // AVX-512 file; Q6_K without VNNI: even at 2 rows, 1.8x at 512 on Zen 4); streamed from memory, from 4
  // (quant_impl.h): Gemma 3's 2 and 3 streams ran 1.09x and 1.06x on the row path (Zen 4 forced to AVX2).
  if ((t == DType::Q4_K || t == DType::Q6_K) && n_x >= kKTilesFromRows) {
    const auto tiles = avx2_vnni() ? matmul_ktiles_avxvnni : matmul_ktiles_avx2;  // ktiles_avx2.h
    return tiles(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
  }
  matmul_k_dispatch(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
