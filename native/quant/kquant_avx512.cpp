// AVX-512 (VNNI) K-quant kernels: kquant_simd.h with vpdpwssd folding the
// scale multiply and the add, and wider tiles in the 32 vector registers.
#define KQ_VNNI 1
#include "quant/kquant_simd.h"

namespace ctx::qk {

void matmul_k_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                     size_t y_stride) {
  matmul_k_dispatch(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
