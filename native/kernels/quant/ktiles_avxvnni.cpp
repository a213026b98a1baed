// Q4_K and Q6_K tiles on AVX2 with AVX-VNNI (built with -mavxvnni; called only where
// the CPU has it, kquant_avx2.cpp): ktiles_avx2.h.
#include "kernels/quant/ktiles_avx2.h"

namespace ctx::qk {

void matmul_ktiles_avxvnni(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                           size_t y_stride) {
  matmul_ktiles<Avx2<true>>(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
