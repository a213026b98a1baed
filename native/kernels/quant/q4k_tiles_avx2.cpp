// Q4_K tiles on AVX2 without AVX-VNNI: q4k_tiles_avx2.h.
#include "kernels/quant/q4k_tiles_avx2.h"

namespace ctx::qk {

void matmul_q4k_tiles_avx2(const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                           size_t y_stride) {
  matmul_q4k_tiles<Avx2<false>>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
