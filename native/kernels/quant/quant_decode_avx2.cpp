// AVX2 product of one or two activation rows with weights repacked 8 rows
// to a group (quant.h repack_x8): decode's matrices read in address order
// (decode_x8_simd.h). A block's 4-sums: vpmaddubsw of the unsigned weights
// (q + bias, at most 31: 2 * 31 * 127 fits an int16) by x, then vpmaddwd with
// ones, started at -bias times x's 4-sums; Q8_0, whose q + 128 would not fit,
// by the sign trick instead: |w| unsigned, x negated where w < 0 (2 * 128 *
// 127 fits). Either way lane l is elements 4l..4l+3, exactly canonical lane l.
#include <immintrin.h>

#include "kernels/quant/decode_x8_simd.h"
#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

bool matvec_x8_avx2(DType t, const void* P, int n_in, int g0, int g1, const BlockQ8A* X, int n_x, float* Y,
                    size_t y_stride) {
  thread_local X8Row xr[kX8MaxActs];
  const int nb = n_in / QK;
  const __m256i ones = _mm256_set1_epi16(1);
  return x8_dispatch(t, [&](auto type) {
    constexpr DType T = decltype(type)::value;
    const auto prep = [&](const BlockQ8A* x, X8Row& row) {
      x8_prep(x, nb, row, [&](__m256i q) {  // -bias * (the 4-sums)
        const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), ones);
        return _mm256_mullo_epi32(sums, _mm256_set1_epi32(-weight_bias(T)));
      });
    };
    const auto isum = [&](const X8Row& x, int b, __m256i u, const uint8_t* blk, int r) {
      const __m256i q = x.blocks[b].q;
      if constexpr (T == DType::Q8_0) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + X8<T>::kQs + 32 * r));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w)), ones);
      } else {
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, q), ones), x.blocks[b].start);
      }
    };
    rows_x8<T>(static_cast<const uint8_t*>(P), nb, g0, g1, X, n_x, xr, prep, isum, Y, y_stride);
  });
}

}  // namespace ctx::qk
