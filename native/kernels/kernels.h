// The kernel table: every SIMD kernel of the forward pass behind one struct
// of function pointers, one table per path (scalar, AVX2, AVX-512). A path is
// chosen once, from CPUID at the first call or by set_isa (the tests force
// each path in turn), and call sites take kernels() and never ask which ISA
// they run on. Every table computes the same bits: the orders are written in
// the families' headers, quant/quant.h, attention/attention.h,
// activations/activations.h and lora/lora_kernels.h (all under kernels/).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cpu.h"

namespace ctx {

enum class DType : int;
struct BlockQ8A;
struct BlockQ8K;

struct Kernels {
  Isa isa;
  // kernels/quant/quant.h
  float (*f16_to_f32)(uint16_t h);
  uint16_t (*f32_to_f16)(float f);
  void (*f32_to_f16_row)(const float* x, uint16_t* y, int n);
  void (*round_row_f16)(const float* x, float* y, int n);
  void (*round_row_bf16)(const float* x, float* y, int n);
  void (*quantize_row_q8k)(const float* x, BlockQ8K* y, int n);
  void (*quantize_row_q8a)(const float* x, BlockQ8A* y, int n);
  void (*matmul_q)(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                   size_t y_stride, uint64_t x_id);
  void (*matmul_k)(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                   size_t y_stride);
  void (*matmul_f)(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                   size_t y_stride);
  // n_x (1 to qk::kX8MaxActs) activation rows against groups [g0, g1) of
  // weights of type t repacked by repack_x8 (quant.h) into
  // Y[r * y_stride + 8 g0 .. 8 g1); false (or null) where the path has no
  // kernel for the type (matmul_x8 then reads the rows).
  bool (*matvec_x8)(DType t, const void* P, int n_in, int g0, int g1, const BlockQ8A* X, int n_x, float* Y,
                    size_t y_stride);
  // kernels/attention/attention.h. The SIMD entries take head_dim % 16 == 0, and to
  // accumulate, pages of 16 keys; attention.cpp sends other shapes to scalar.
  void (*attn_scores_f16)(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale,
                          float* scores, int score_stride);
  void (*attn_scores_q8)(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                         float scale, float* scores, int score_stride);
  void (*attn_accumulate_f16)(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared,
                              int pt, int v_stride, const int* n, int hd, float* const* out, bool hot);
  void (*attn_accumulate_q8)(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                             const uint16_t* const* const* scales, int shared, int pt, int v_stride, int s_stride,
                             const int* n, int hd, float* const* out, bool hot);
  float (*max_f32)(const float* x, int n);
  void (*scale_round_f16)(float* x, int n, float scale);
  // kernels/activations/activations.h
  double (*exp_shift_sum)(float* x, int n, float shift);
  void (*silu_mul)(float* g, const float* u, int n);
  void (*gelu_mul)(float* g, const float* u, int n, const uint16_t* table);
  void (*rope)(float* v, int n_heads, int hd, int half, bool neox, const float* cs);
  void (*rmsnorm_rows)(const float* x, const float* w, float* out, int n_rows, int n, float eps);
  // kernels/lora/lora_kernels.h
  void (*lora_up)(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor,
                  float* y, size_t y_stride);
  void (*lora_up_f16)(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x,
                      float factor, float* y, size_t y_stride);
  void (*lora_up_bf16)(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x,
                       float factor, float* y, size_t y_stride);
};

const Kernels& kernels();         // the chosen path's table
const Kernels& scalar_kernels();  // the reference path, for shapes a SIMD entry does not take
Isa active_isa();                 // the chosen path: kernels().isa
void set_isa(Isa isa);            // choose a path; throws if this CPU lacks it

}  // namespace ctx
