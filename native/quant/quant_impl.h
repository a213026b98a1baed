// Per-ISA entry points behind the dispatchers in quant.cpp, plus the small
// pieces every path shares. Each function follows the canonical orders of
// quant.h exactly; quant.cpp picks one from ctx::active_isa().
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace ctx::qk {

// Byte sizes of one 32-element block.
constexpr size_t kQ4_0Bytes = sizeof(BlockQ4_0);  // 18
constexpr size_t kQ4_1Bytes = sizeof(BlockQ4_1);  // 20
constexpr size_t kQ8_0Bytes = sizeof(BlockQ8_0);  // 34
static_assert(kQ4_0Bytes == 18 && kQ4_1Bytes == 20 && kQ8_0Bytes == 34 && sizeof(BlockQ8A) == 40,
              "GGML block layouts must be packed");

void matmul_q_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                   size_t y_stride);
void matmul_f_avx2(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                   size_t y_stride);
void f32_to_f16_row_avx2(const float* x, uint16_t* y, int n);

void matmul_q_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                     size_t y_stride);
void matmul_f_avx512(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                     size_t y_stride);
void f32_to_f16_row_avx512(const float* x, uint16_t* y, int n);

// The canonical hsum16 / hsum8 of quant.h on floats in memory (the scalar
// reference and scalar tails).
// static: each translation unit keeps its own copy. With -flto an inline
// function compiled once with -mavx2 and once for baseline x86-64 is one ODR
// entity, and the linker could hand the AVX2 build to the scalar path.
static inline float hsum16(float* a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

static inline float hsum8(float* a) {
  for (int w = 4; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

}  // namespace ctx::qk
