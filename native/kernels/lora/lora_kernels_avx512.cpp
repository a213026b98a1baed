// AVX-512 form of lora::up (lora_kernels_simd.h): 16 outputs, one per lane.
#include "kernels/lora/lora_kernels_simd.h"

namespace ctx::lora {

void up_avx512(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
               size_t y_stride) {
  up_simd<F32x16>(bt, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

void up_f16_avx512(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                   float* y, size_t y_stride) {
  up_simd<F32x16>(bt, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

void up_bf16_avx512(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                    float* y, size_t y_stride) {
  up_simd<F32x16>(reinterpret_cast<const Bf16*>(bt), rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

}  // namespace ctx::lora
