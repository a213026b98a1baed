// The LoRA up-projection kernel (models/lora.h), one per path in the kernel
// table (kernels/kernels.h). With B stored transposed in blocks of 16 outputs,
// bt[j, o] at blocked_index(j, o, rank) (each block's rank x 16 values one run
// of memory, n_out rounded up to 16 with zeros; blocks() makes it from B):
//   for o in [o0, o1), r in [0, n_x):
//     acc[16] = 0; for j in 0..rank-1 (ascending): acc[j % 16] = fma(bt[j, o], t[r, j], acc[j % 16])
//     dot = hsum16(acc)  (kernels/quant/quant.h: for w in (8, 4, 2, 1): a[i] = a[i] + a[i + w] for i < w)
//     y[r * y_stride + o] = y[r * y_stride + o] + factor * dot      (a multiply, then an add)
// which is matmul_f's canonical order for B t, added into y. The SIMD paths
// run 16 (AVX-512) or 8 (AVX2) outputs o side by side, one lane each, so a
// short rank costs no horizontal sum; every path gives the same bits.
// up_f16_*, up_bf16_*: the same with bt in f16 or bf16 bits (a 16-bit adapter
// file kept as it is, half the bytes), each value widened to float exactly
// before its fma.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ctx::lora {

constexpr int kBlock = 16;  // outputs per block of bt

// bf16 bits as their own type, so the kernels' templates widen them as bf16
// (uint16_t is f16); up_bf16_* read their uint16_t bits through it.
struct Bf16 {
  uint16_t bits;
};

// static: each translation unit keeps its own copy (with -flto an inline
// function built with -mavx512f in one unit could be handed to the baseline
// path; kernels/quant/quant_impl.h).
static inline size_t blocked_index(int j, int o, int rank) {
  return (static_cast<size_t>(o / kBlock) * rank + j) * kBlock + o % kBlock;
}

// bt in blocks from B (n_out, rank), whose value (o, j) is at o * o_stride +
// j * j_stride: row-major as GGUF's lora_b by default, or (1, n_out) from B
// already transposed.
template <typename T>
static std::vector<T> blocks(const T* b, int n_out, int rank, size_t o_stride = 0, size_t j_stride = 1) {
  if (o_stride == 0) o_stride = static_cast<size_t>(rank);
  std::vector<T> bt(static_cast<size_t>((n_out + kBlock - 1) / kBlock) * kBlock * rank, T{});
  for (int o = 0; o < n_out; ++o)
    for (int j = 0; j < rank; ++j) bt[blocked_index(j, o, rank)] = b[o * o_stride + j * j_stride];
  return bt;
}

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
void up_bf16_scalar(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                    float* y, size_t y_stride);
void up_bf16_avx2(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                  float* y, size_t y_stride);
void up_bf16_avx512(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                    float* y, size_t y_stride);

}  // namespace ctx::lora
