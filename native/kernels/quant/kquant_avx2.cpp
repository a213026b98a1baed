// AVX2 K-quant kernels: kquant_simd.h with vpmaddwd + vpaddd for the scales.
#define KQ_VNNI 0
#include "kernels/quant/kquant_simd.h"

namespace ctx::qk {

void matmul_k_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                   size_t y_stride) {
  // 8 weight rows a vector beat a pair's horizontal sums for 2 or more activation rows (as in the AVX-512 file).
  if (t == DType::Q4_K && n_x > 1) {
    const auto tiles = avx2_vnni() ? matmul_q4k_tiles_avxvnni : matmul_q4k_tiles_avx2;  // q4k_tiles_avx2.h
    return tiles(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
  }
  matmul_k_dispatch(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
