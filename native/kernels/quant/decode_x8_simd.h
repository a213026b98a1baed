// One activation row against Q8_0 repacked 8 rows to a group (quant.h
// repack_q8_0x8), its loop written once for quant_decode_avx512.cpp and
// quant_decode_avx2.cpp, each built with its own flags (everything is in an
// anonymous namespace). A path gives isum(b, w): the 8 canonical int32 lanes
// of block b of x against the 32 weight bytes w (as loaded, signed).
//
// A ymm holds one (weight row, x) pair's 8 canonical lanes, and per block and
// pair the work is the isum, one convert and one fma whose scale f16(d_w) *
// d_x comes from a table: the bits of matmul_q. A group's block b holds the
// 8 rows' d (one vector of scales) and then their 32 qs each, read in address
// order; the scales of kChunk blocks are made before those blocks run (a
// scale stored and broadcast back at once would wait for the store). While a
// group multiplies, block b asks for block b of the next group, to L2.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/quant/quant.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr size_t kX8GroupBlock = 8 * sizeof(BlockQ8_0);  // a group's block: 8 f16 d, then 8 x 32 qs

// Groups [g0, g1) of P (nb blocks a row) into Y[8 g0, 8 g1); xd: x's d per block.
template <typename Isum>
void groups_x8(const uint8_t* P, int nb, int g0, int g1, const float* xd, Isum isum, float* Y) {
  constexpr int kChunk = 8;
  const size_t group_bytes = static_cast<size_t>(nb) * kX8GroupBlock;
  for (int g = g0; g < g1; ++g) {
    const uint8_t* p = P + static_cast<size_t>(g) * group_bytes;
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    alignas(32) float d[kChunk][8];
    for (int c = 0; c < nb; c += kChunk) {
      const int n = std::min(kChunk, nb - c);
      for (int i = 0; i < n; ++i) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (c + i) * kX8GroupBlock));
        _mm256_store_ps(d[i], _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(xd[c + i])));
      }
      for (int i = 0; i < n; ++i) {
        const int b = c + i;
        const uint8_t* blk = p + b * kX8GroupBlock;
        for (size_t off = 0; off < kX8GroupBlock; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk + group_bytes + off), _MM_HINT_T1);
        const __m256i* q = reinterpret_cast<const __m256i*>(blk + 16);
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r)
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[i][r]), _mm256_cvtepi32_ps(isum(b, _mm256_loadu_si256(q + r))),
                                   acc[r]);
      }
    }
    for (int r = 0; r < 8; ++r) Y[8 * g + r] = hsum8_ps(acc[r]);
  }
}

}  // namespace

}  // namespace ctx::qk
