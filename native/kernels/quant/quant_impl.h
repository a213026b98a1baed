// Per-ISA entry points behind the dispatchers in quant.cpp, plus the small
// pieces every path shares. Each function follows the canonical orders of
// quant.h exactly; kernels/kernels.cpp puts each in its path's table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "kernels/quant/quant.h"

namespace ctx::qk {

// Byte sizes of one 32-element block.
constexpr size_t kQ4_0Bytes = sizeof(BlockQ4_0);  // 18
constexpr size_t kQ4_1Bytes = sizeof(BlockQ4_1);  // 20
constexpr size_t kQ8_0Bytes = sizeof(BlockQ8_0);  // 34
static_assert(kQ4_0Bytes == 18 && kQ4_1Bytes == 20 && kQ8_0Bytes == 34 && sizeof(BlockQ8A) == 40,
              "GGML block layouts must be packed");
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ2_K) == 84 &&
                  sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 &&
                  sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8K) == 292,
              "GGML block layouts must be packed");

// The blocks-of-32 integer types: bytes of one block, and whether the block
// carries a min (whose term goes through the activation sums s).
constexpr size_t block_bytes_q(DType t) {
  return t == DType::Q4_0 ? kQ4_0Bytes
         : t == DType::Q4_1 ? kQ4_1Bytes
         : t == DType::Q5_0 ? sizeof(BlockQ5_0)
         : t == DType::Q5_1 ? sizeof(BlockQ5_1)
                            : kQ8_0Bytes;
}
constexpr bool has_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
// What the weight value (q - 8, q - 16, q) is shifted by to make the unsigned
// byte q (Q8_0: q + 128) that vpdpbusd multiplies; the activation's block then
// starts its sum at -bias times its 4-sums.
constexpr int weight_bias(DType t) {
  return t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : t == DType::Q8_0 ? 128 : 0;
}

// A blocks-of-32 block's fields: where each is in the block, and its bytes
// (0: the type has none). The decode copies (quant.h repack_x8) keep a
// group's block as each field of its 8 rows in turn, d, m, qh, qs:
// x8_fields gives where each field's 8 starts there.
struct BlockField {
  size_t at, bytes;
};
struct BlockFields {
  BlockField d, m, qh, qs;
};
constexpr BlockFields block_fields(DType t) {
  switch (t) {
    case DType::Q4_0: return {{offsetof(BlockQ4_0, d), 2}, {0, 0}, {0, 0}, {offsetof(BlockQ4_0, qs), 16}};
    case DType::Q4_1: return {{offsetof(BlockQ4_1, d), 2}, {offsetof(BlockQ4_1, m), 2}, {0, 0}, {offsetof(BlockQ4_1, qs), 16}};
    case DType::Q5_0: return {{offsetof(BlockQ5_0, d), 2}, {0, 0}, {offsetof(BlockQ5_0, qh), 4}, {offsetof(BlockQ5_0, qs), 16}};
    case DType::Q5_1:
      return {{offsetof(BlockQ5_1, d), 2}, {offsetof(BlockQ5_1, m), 2}, {offsetof(BlockQ5_1, qh), 4}, {offsetof(BlockQ5_1, qs), 16}};
    default: return {{offsetof(BlockQ8_0, d), 2}, {0, 0}, {0, 0}, {offsetof(BlockQ8_0, qs), 32}};
  }
}
constexpr int kX8Rows = 8;     // weight rows a group of the copies
constexpr int kX8MaxActs = 2;  // activation rows the copies' kernels take (Kernels::matvec_x8)
constexpr BlockFields x8_fields(DType t) {
  const BlockFields f = block_fields(t);
  const size_t m = kX8Rows * f.d.bytes, qh = m + kX8Rows * f.m.bytes, qs = qh + kX8Rows * f.qh.bytes;
  return {{0, f.d.bytes}, {m, f.m.bytes}, {qh, f.qh.bytes}, {qs, f.qs.bytes}};
}

// nearbyint (round half to even) for |v| <= 2^22, as ggml's nearest_int.
int round_half_even(float v);
std::invalid_argument unsupported_type(DType t);

// The 8 scales and 8 mins of a Q4_K / Q5_K super-block (6 bits each), as
// ggml's get_scale_min_k4: sc[j] and m[j] for sub-block j (32 elements).
static inline void unpack_k4_scales(const uint8_t* q, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    m[j] = q[j + 4] & 63;
    sc[j + 4] = (q[j + 8] & 0xF) | ((q[j] >> 6) << 4);
    m[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
  }
}

// The 16 scales of a Q3_K super-block (6 bits each, not yet offset by -32).
static inline void unpack_q3k_scales(const uint8_t* q, uint8_t* sc) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? q[j] & 0xF : q[j - 8] >> 4;
    const int high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = static_cast<uint8_t>(low | (high << 4));
  }
}

// Q5_* element j (0..31): the Q4 nibble plus bit j of qh as bit 4.
template <class B>
static inline int q5_value(const B& b, int j) {
  const uint32_t qh = static_cast<uint32_t>(b.qh[0]) | static_cast<uint32_t>(b.qh[1]) << 8 |
                      static_cast<uint32_t>(b.qh[2]) << 16 | static_cast<uint32_t>(b.qh[3]) << 24;
  return (j < 16 ? b.qs[j] & 0xF : b.qs[j - 16] >> 4) | static_cast<int>(((qh >> j) & 1) << 4);
}

// Integer weight value helpers shared by the scalar kernels and dequantization.
int q6k_value(const BlockQ6_K& b, int e);      // element e (0..255): 0..63
int q2_low_bits(const uint8_t* qs, int e);     // Q2_K / Q3_K element e's 2 low bits

// The scalar path: the canonical orders written literally (quant.cpp, kquant.cpp).
float f16_to_f32_soft(uint16_t h);   // in integer arithmetic: what the tests check against numpy
uint16_t f32_to_f16_soft(float f);
float f16_to_f32_hw(uint16_t h);     // one F16C instruction each, bit-identical (the SIMD paths' tables)
uint16_t f32_to_f16_hw(float f);
void f32_to_f16_row_scalar(const float* x, uint16_t* y, int n);
// quant.h round_row_f16 / round_row_bf16 (act_round*.cpp); round_bits_bf16: one value's bits.
uint32_t round_bits_bf16(uint32_t u);
void round_row_f16_scalar(const float* x, float* y, int n);
void round_row_bf16_scalar(const float* x, float* y, int n);
void round_row_f16_avx2(const float* x, float* y, int n);
void round_row_bf16_avx2(const float* x, float* y, int n);
void round_row_f16_avx512(const float* x, float* y, int n);
void round_row_bf16_avx512(const float* x, float* y, int n);
void quantize_row_q8k_scalar(const float* x, BlockQ8K* y, int n);
void quantize_row_q8a_scalar(const float* x, BlockQ8A* y, int n);
// The same bytes on 8 and 16 lanes (q8a_avx2.cpp, q8a_avx512.cpp).
void quantize_row_q8a_avx2(const float* x, BlockQ8A* y, int n);
void quantize_row_q8a_avx512(const float* x, BlockQ8A* y, int n);
void matmul_q_scalar(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                     size_t y_stride, uint64_t x_id);
void matmul_k_scalar(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                     size_t y_stride);
void matmul_f_scalar(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                     size_t y_stride);

void quantize_row_q8k_avx2(const float* x, BlockQ8K* y, int n);
void quantize_row_q8k_avx512(const float* x, BlockQ8K* y, int n);
void matmul_k_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                   size_t y_stride);
void matmul_k_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                     size_t y_stride);
// Q4_K and Q6_K (t) with the weight rows as lanes (ktiles_*.cpp), from kKTilesFromRows activation
// rows on. In cache the tiles' unpacking of 16 (8) weight rows at once pays from 2 rows; streamed
// from memory, as decode's weights are, only from 4, so 2 and 3 rows (a verified draft, a few
// streams) take the row-at-a-time path, which prefetches as it goes (kquant_simd.h).
constexpr int kKTilesFromRows = 4;
void matmul_ktiles_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                          size_t y_stride);
void matmul_ktiles_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                        size_t y_stride);
// The same with AVX-VNNI (ktiles_avx2.h; avx2_vnni below).
void matmul_ktiles_avxvnni(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                           size_t y_stride);

// The Q4_K tiles' activation side: out[4b + k] = q8s[2k] | q8s[2k + 1] << 16
// (int16 halves, q8s[s] = bsums[2s] + bsums[2s + 1], at most 32 * 127) for
// blocks b < n, so one vpmaddwd against the mins m[2k] | m[2k + 1] << 16
// gives mk[k] of quant.h.
static inline void q8s_pairs(const BlockQ8K* x, size_t n, int32_t* out) {
  for (size_t b = 0; b < n; ++b) {
    const int16_t* bs = x[b].bsums;
    for (int k = 0; k < 4; ++k) {
      const auto lo = static_cast<uint16_t>(bs[4 * k] + bs[4 * k + 1]), hi = static_cast<uint16_t>(bs[4 * k + 2] + bs[4 * k + 3]);
      out[4 * b + k] = static_cast<int32_t>(static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16);
    }
  }
}

// The Q6_K tiles' activation side, 16 int32s a block: where `starts`, the raw
// sums' starts -32 * bsums[s] (s < 16: int32 sums, VNNI); otherwise the pairs
// bsums[2m] | bsums[2m + 1] << 16 (m < 8; int16 halves, |bsums| <= 16 * 127)
// for one vpmaddwd against the scale pairs sc[2m] | sc[2m + 1] << 16.
static inline void q6k_corr(const BlockQ8K* x, size_t n, bool starts, int32_t* out) {
  for (size_t b = 0; b < n; ++b) {
    const int16_t* bs = x[b].bsums;
    int32_t* o = out + 16 * b;
    for (int s = 0; s < 16; ++s) {
      if (starts) {
        o[s] = -32 * bs[s];
      } else {
        o[s] = s < 8 ? static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(bs[2 * s])) |
                                            static_cast<uint32_t>(static_cast<uint16_t>(bs[2 * s + 1])) << 16)
                     : 0;
      }
    }
  }
}

void matmul_q_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                   size_t y_stride, uint64_t x_id);
// Many activation rows (quant_prefill_avx2.h); x_id as matmul_q's. Built
// twice: with AVX2 alone, and with AVX-VNNI too (the same bits, fewer
// instructions), which the AVX2 path takes where the CPU has it (core/cpu.h
// has_avx_vnni) unless set_avx2_vnni(false); the tests force each.
void matmul_q_prefill_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                           size_t y_stride, uint64_t x_id);
void matmul_q_prefill_avxvnni(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x,
                              float* Y, size_t y_stride, uint64_t x_id);
bool avx2_vnni();
void set_avx2_vnni(bool on);  // std::invalid_argument for on where the CPU lacks AVX-VNNI
void matmul_f_avx2(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                   size_t y_stride);
void f32_to_f16_row_avx2(const float* x, uint16_t* y, int n);

void matmul_q_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                     size_t y_stride, uint64_t x_id);
// Many activation rows (quant_prefill_avx512.cpp), in one of two tile forms:
// ymm registers each holding one (weight row, activation row) pair, or zmm
// registers holding two. The same bits either way; zmm is the faster where
// 512-bit operations run whole (core/cpu.h), ymm on Zen 4. Chosen from CPUID
// at the first call; the tests force each.
enum class PrefillTiles : int { ymm = 0, zmm = 1 };
PrefillTiles prefill_tiles();
void set_prefill_tiles(PrefillTiles tiles);
void matmul_q_prefill_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                             size_t y_stride, uint64_t x_id);
void matmul_f_avx512(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                     size_t y_stride);
void f32_to_f16_row_avx512(const float* x, uint16_t* y, int n);
// Q4_1 with 2 to 16 activation rows and Q8_0 with 2 to 32 (batched decode;
// quant_rows_avx512.cpp); false for other types and row counts.
bool matmul_q_rows_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                          size_t y_stride);
// Q4_1 with 2 to 10 activation rows and Q8_0 with 2 to 32, on AVX2 (a verified
// draft, batched decode; quant_rows_avx2.cpp); false for other types and counts.
bool matmul_q_rows_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                        size_t y_stride);
// Q8_0 with 9 to 16 activation rows, two pairs a zmm (batched decode with
// the zmm tiles; quant_rows_zmm_avx512.cpp).
void matmul_q_rows_zmm_avx512(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                              size_t y_stride);
// One activation row (decode) of Q8_0 (quant_decode_avx512.cpp); false for
// the other types, which the tile path takes.
bool matvec_q_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* x, float* Y);
// One or two (kX8MaxActs) activation rows against groups [g0, g1) of
// repacked weights (quant.h repack_x8; quant_decode_avx512.cpp,
// quant_decode_avx2.cpp); false for types without the layout.
bool matvec_x8_avx512(DType t, const void* P, int n_in, int g0, int g1, const BlockQ8A* X, int n_x, float* Y,
                      size_t y_stride);
bool matvec_x8_avx2(DType t, const void* P, int n_in, int g0, int g1, const BlockQ8A* X, int n_x, float* Y,
                    size_t y_stride);

// The canonical hsum16 / hsum8 of quant.h on floats in memory (the scalar
// reference and scalar tails).
// static: each translation unit keeps its own copy. With -flto an inline
// function compiled once with -mavx2 and once for baseline x86-64 is one ODR
// entity, and the linker could hand the AVX2 build to the scalar path. (The
// standard library's templates cannot be made static: CMakeLists.txt links
// the ISA units last so that the baseline copy is the one kept, and
// tests/test_isa_isolation.py checks the built module.)
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
