// The LoRA up-projection kernel (models/lora.h), one per path in the kernel
// table (kernels/kernels.h). With B stored transposed, bt (rank, n_out):
//   for o in [o0, o1), r in [0, n_x):
//     acc[16] = 0; for j in 0..rank-1 (ascending): acc[j % 16] = fma(bt[j, o], t[r, j], acc[j % 16])
//     dot = hsum16(acc)  (kernels/quant/quant.h: for w in (8, 4, 2, 1): a[i] = a[i] + a[i + w] for i < w)
//     y[r * y_stride + o] = y[r * y_stride + o] + factor * dot      (a multiply, then an add)
// which is matmul_f's canonical order for B t, added into y. The SIMD paths
// run 16 (AVX-512) or 8 (AVX2) outputs o side by side, one lane each, so a
// short rank costs no horizontal sum; every path gives the same bits.
// up_f16_*: the same with bt in f16 (an f16 adapter file kept as it is, half
// the bytes), each value widened to float exactly before its fma.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ctx::lora {

void up_scalar(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
               size_t y_stride);
void up_avx2(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride);
void up_avx512(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
               size_t y_stride);
void up_f16_scalar(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                   float* y, size_t y_stride);
void up_f16_avx2(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                 float* y, size_t y_stride);
void up_f16_avx512(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                   float* y, size_t y_stride);

}  // namespace ctx::lora
