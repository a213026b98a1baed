// AVX2 product of one activation row with Q8_0 weights repacked 8 rows to a
// group (quant.h repack_q8_0x8): decode's output matrix, read in address
// order (decode_x8_simd.h). A block's 4-sums by the sign trick: |w|
// unsigned, x negated where w < 0, then vpmaddubsw (2 * 128 * 127 fits an
// int16) and vpmaddwd with ones: lane l is elements 4l..4l+3, exactly
// canonical lane l.
#include <immintrin.h>

#include <vector>

#include "kernels/quant/decode_x8_simd.h"
#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

namespace {

struct XBlock {
  __m256i v;  // one activation block's 32 int8
};
struct XRow {
  std::vector<XBlock> q;  // [block]
  std::vector<float> d;   // [block] d_x
};

}  // namespace

void matvec_q8_0x8_avx2(const void* P, int n_in, int g0, int g1, const BlockQ8A* x, float* Y) {
  thread_local XRow xr;
  const int nb = n_in / QK;
  xr.q.resize(nb);
  xr.d.resize(nb);
  for (int b = 0; b < nb; ++b) {
    xr.q[b].v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    xr.d[b] = x[b].d;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const auto isum = [&](int b, __m256i w) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xr.q[b].v, w)), ones);
  };
  groups_x8(static_cast<const uint8_t*>(P), nb, g0, g1, xr.d.data(), isum, Y);
}

}  // namespace ctx::qk
