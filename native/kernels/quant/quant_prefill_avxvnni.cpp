// AVX2 prefill with AVX-VNNI (built with -mavxvnni; called only where the
// CPU has it, quant_avx2.cpp): quant_prefill_avx2.h.
#include "kernels/quant/quant_prefill_avx2.h"

namespace ctx::qk {

void matmul_q_prefill_avxvnni(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x,
                              float* Y, size_t y_stride, uint64_t x_id) {
  matmul_q_prefill_simd<Avx2<true>>(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
}

}  // namespace ctx::qk
