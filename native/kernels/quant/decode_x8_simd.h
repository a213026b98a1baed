// One or two activation rows against weights repacked 8 rows to a group
// (quant.h repack_x8), the loop written once for quant_decode_avx512.cpp and
// quant_decode_avx2.cpp, each built with its own flags (everything is in an
// anonymous namespace). A path gives isum(x, b, u, blk, r): the 8 canonical
// int32 lanes of x's block b against row r of the group's block at blk, whose
// 32 weights x8_unsigned made u (q + bias as bytes: quant.h's weight value
// plus weight_bias(T), quant_impl.h, so that x's block needs only its start,
// -bias times its 4-sums).
//
// A ymm holds one (weight row, x) pair's 8 canonical lanes, and per block and
// pair the work is the isum, one convert and one fma whose scale f16(d_w) *
// d_x comes from a table; Q4_1 / Q5_1's min sums run as one vector of the 8
// rows' chains, summ = fma(f16(m_w), s_x, summ) a block, blocks in order:
// the bits of matmul_q. A group's block b holds the 8 rows' d (one vector of
// scales), their m, their qh, and then their qs, read in address order; the
// scales of kChunk blocks are made before those blocks run (a scale stored and
// broadcast back at once would wait for the store). While a group
// multiplies, block b asks for block b of the next group, to L2.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/quant/quant.h"
#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

// Where a group's block keeps its fields (quant_impl.h x8_fields).
template <DType T>
struct X8 {
  static constexpr BlockFields kFields = x8_fields(T);
  static constexpr bool kQ5 = kFields.qh.bytes != 0;
  static constexpr size_t kQsBytes = kFields.qs.bytes;  // a row's qs
  static constexpr size_t kM = kFields.m.at;            // 8 f16 m (with a min)
  static constexpr size_t kQh = kFields.qh.at;          // 8 x 4 bytes of qh (Q5_*)
  static constexpr size_t kQs = kFields.qs.at;          // 8 rows' qs
  static constexpr size_t kGroupBlock = kX8Rows * block_bytes_q(T);
  static_assert(kQs + kX8Rows * kQsBytes == kGroupBlock, "a group's block holds its rows' blocks' bytes");
};

// Row r's 32 weights of the group's block at blk as unsigned bytes, the
// weight value plus weight_bias(T): Q4_* q (elements 0..15 the low nibbles,
// 16..31 the high ones), Q5_* with bit e of qh as bit 4 of element e, Q8_0's
// qs + 128.
template <DType T>
inline __m256i x8_unsigned(const uint8_t* blk, int r) {
  const uint8_t* qs = blk + X8<T>::kQs + r * X8<T>::kQsBytes;
  if constexpr (T == DType::Q8_0) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)), _mm256_set1_epi8(-128));
  } else {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    if constexpr (!X8<T>::kQ5) return v;
    return _mm256_or_si256(v, _mm256_and_si256(bytes_from_bits(blk + X8<T>::kQh + 4 * r), _mm256_set1_epi8(16)));
  }
}

// x as the kernels take it: per block its 32 int8 and the start of its
// isums (a path's: -bias times its 4-sums), d and s.
struct X8Block {
  __m256i q, start;
};
struct X8Row {
  std::vector<X8Block> blocks;
  std::vector<float> d, s;
};

// x's nb blocks into xr, start(q) making each block's start. d and s are
// padded with 16 zeros (quant_decode_avx512.cpp's rows load 16 at a time).
template <typename Start>
void x8_prep(const BlockQ8A* x, int nb, X8Row& xr, Start start) {
  xr.blocks.resize(nb);
  xr.d.assign(nb + 16, 0.0f);
  xr.s.assign(nb + 16, 0.0f);
  for (int b = 0; b < nb; ++b) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    xr.blocks[b] = {q, start(q)};
    xr.d[b] = x[b].d;
    xr.s[b] = x[b].s;
  }
}

// fn(std::integral_constant<DType, T>) for the types with the layout; false for the others.
template <typename Fn>
bool x8_dispatch(DType t, Fn fn) {
  switch (t) {
    case DType::Q4_0: return fn(std::integral_constant<DType, DType::Q4_0>{}), true;
    case DType::Q4_1: return fn(std::integral_constant<DType, DType::Q4_1>{}), true;
    case DType::Q5_0: return fn(std::integral_constant<DType, DType::Q5_0>{}), true;
    case DType::Q5_1: return fn(std::integral_constant<DType, DType::Q5_1>{}), true;
    case DType::Q8_0: return fn(std::integral_constant<DType, DType::Q8_0>{}), true;
    default: return false;
  }
}

// Groups [g0, g1) of P (nb blocks a row) against the R prepared rows xr[j]
// into Y[j * y_stride + 8 g0 .. 8 g1). A row's weights are unpacked once for
// the R activation rows.
template <DType T, int R, typename Isum>
void groups_x8(const uint8_t* P, int nb, int g0, int g1, const X8Row* xr, Isum isum, float* Y, size_t y_stride) {
  constexpr int kChunk = 8;
  constexpr size_t kGB = X8<T>::kGroupBlock;
  const size_t group_bytes = static_cast<size_t>(nb) * kGB;
  for (int g = g0; g < g1; ++g) {
    const uint8_t* p = P + static_cast<size_t>(g) * group_bytes;
    __m256 acc[R][8];
    for (auto& row : acc)
      for (auto& a : row) a = _mm256_setzero_ps();
    __m256 summ[R];  // lane r: weight row r's min sum
    for (auto& m : summ) m = _mm256_setzero_ps();
    alignas(32) float d[kChunk][R][8];
    for (int c = 0; c < nb; c += kChunk) {
      const int n = std::min(kChunk, nb - c);
      for (int i = 0; i < n; ++i) {
        const uint8_t* blk = p + (c + i) * kGB;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
        const __m256 mw = has_min(T) ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + X8<T>::kM)))
                                     : _mm256_setzero_ps();
        for (int j = 0; j < R; ++j) {
          _mm256_store_ps(d[i][j], _mm256_mul_ps(dw, _mm256_set1_ps(xr[j].d[c + i])));
          if constexpr (has_min(T)) summ[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xr[j].s[c + i]), summ[j]);
        }
      }
      for (int i = 0; i < n; ++i) {
        const int b = c + i;
        const uint8_t* blk = p + b * kGB;
        for (size_t off = 0; off < kGB; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk + group_bytes + off), _MM_HINT_T1);
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          const __m256i u = x8_unsigned<T>(blk, r);
          for (int j = 0; j < R; ++j)
            acc[j][r] = _mm256_fmadd_ps(_mm256_set1_ps(d[i][j][r]), _mm256_cvtepi32_ps(isum(xr[j], b, u, blk, r)),
                                        acc[j][r]);
        }
      }
    }
    for (int j = 0; j < R; ++j) {
      alignas(32) float m[8];
      _mm256_store_ps(m, summ[j]);
      for (int r = 0; r < 8; ++r)
        Y[j * y_stride + 8 * g + r] = has_min(T) ? hsum8_ps(acc[j][r]) + m[r] : hsum8_ps(acc[j][r]);
    }
  }
}

// R = n_x (1 or kX8MaxActs = 2) rows of X prepared into xr by prep(X row,
// xr[j]), then groups_x8. (Three ran 1.01-1.07x the rows kernel over the
// file's rows, four 0.95x: the sums of 24 or 32 pairs leave too few
// registers; session 43, Zen 4.)
template <DType T, typename Prep, typename Isum>
void rows_x8(const uint8_t* P, int nb, int g0, int g1, const BlockQ8A* X, int n_x, X8Row* xr, Prep prep, Isum isum,
             float* Y, size_t y_stride) {
  static_assert(kX8MaxActs == 2, "a kernel for each row count");
  for (int j = 0; j < n_x; ++j) prep(X + static_cast<size_t>(j) * nb, xr[j]);
  if (n_x == 1)
    groups_x8<T, 1>(P, nb, g0, g1, xr, isum, Y, y_stride);
  else
    groups_x8<T, 2>(P, nb, g0, g1, xr, isum, Y, y_stride);
}

}  // namespace

}  // namespace ctx::qk
