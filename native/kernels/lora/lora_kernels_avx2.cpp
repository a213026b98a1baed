// AVX2 form of lora::up (lora_kernels_simd.h): 8 outputs, one per lane; a
// last partial group goes through a zero-padded copy.
#include "kernels/lora/lora_kernels_simd.h"

namespace ctx::lora {

void up_avx2(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  up_simd<F32x8>(bt, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

void up_f16_avx2(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                 float* y, size_t y_stride) {
  up_simd<F32x8>(bt, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

void up_bf16_avx2(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                  float* y, size_t y_stride) {
  up_simd<F32x8>(reinterpret_cast<const Bf16*>(bt), rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

}  // namespace ctx::lora
