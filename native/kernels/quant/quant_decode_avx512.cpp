// AVX-512 matrix-vector product of Q8_0 weights and one activation row
// (decode), in the canonical order of quant.h. Q8_0 is the tied output matrix
// of most small models (Gemma 3 270M: 168 MB of its 247 MB a token), so this
// one product sets the decode speed.
//
// Decode reads every weight once, so the kernel must keep up with memory: a
// 256-bit register holds one (weight row, x) pair's 8 canonical lanes, and
// per block the work is one vpdpbusd (started at the bias correction), one
// convert and one fma whose scale d = f16(d_w) * d_x comes from memory as an
// embedded broadcast. The scales are formed 16 blocks at a time: the 16
// blocks' f16 headers of a row are gathered, widened and multiplied by the 16
// d_x in one zmm each, then stored for the fmas to broadcast. (The prefill
// tile of quant_avx512.cpp packs two pairs a zmm instead, which needs the
// scale vector built per block: on cores that split zmm work in two halves,
// such as Zen 4, that costs decode about half its speed; Q4_0 and Q5_0, whose
// nibbles take more work to unpack, measured faster there, so they stay.)
// Every pair still has its own lanes in canonical order, so the results are
// the other paths'.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/quant/decode_x8_simd.h"
#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr int kRows = 8;       // weight rows a group: independent chains, x blocks read once per group
constexpr int kScaleChunk = 16;  // blocks whose scales are formed together
static_assert(kScaleChunk <= 16, "x8_prep pads x's scales by 16: a chunk's load reads that far");
constexpr int kAhead = 1;        // groups of rows prefetched ahead (1 measured best; 2-8 lose a quarter)

// x ready for vpdpbusd (decode_x8_simd.h's X8Row): per block its 32 int8,
// the start -bias * (its 4-sums), with the weights biased by weight_bias(T)
// to unsigned, and d_x and s_x.
template <DType T>
void prep(const BlockQ8A* x, int nb, X8Row& xr) {
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(weight_bias(T)));
  x8_prep(x, nb, xr, [&](__m256i q) {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, q));
  });
}

// A block's 32 weights as unsigned bytes (q + 128), in element order.
inline __m256i weights(const uint8_t* blk) {
  return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), _mm256_set1_epi8(-128));
}

// Rows [o, o + NR) of W against the prepared x.
template <int NR>
void rows(const uint8_t* w0, size_t row_bytes, int nb, const X8Row& x, float* y) {
  constexpr size_t bb = sizeof(BlockQ8_0);
  __m256 acc[NR];
  for (auto& a : acc) a = _mm256_setzero_ps();
  alignas(64) float d[NR][kScaleChunk];
  // The 16 headers of a chunk, 32 bits from each block's start (d is its first 2 bytes).
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(bb)));
  for (int c = 0; c < nb; c += kScaleChunk) {
    const int n = std::min(kScaleChunk, nb - c);
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
    const __m512 dx = _mm512_loadu_ps(x.d.data() + c);
    for (int r = 0; r < NR; ++r) {
      const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets, w0 + r * row_bytes + c * bb, 1);
      _mm512_store_ps(d[r], _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)), dx));
    }
    for (int b = c; b < c + n; ++b) {
      // Decode streams every weight from memory once: ask for the bytes a
      // few groups ahead, a group's worth spread over its blocks.
      const uint8_t* ahead = w0 + kAhead * NR * row_bytes + static_cast<size_t>(b) * NR * bb;
      for (size_t off = 0; off < NR * bb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m256i isum = _mm256_dpbusd_epi32(x.blocks[b].start, weights(w0 + r * row_bytes + b * bb), x.blocks[b].q);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r][b - c]), _mm256_cvtepi32_ps(isum), acc[r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) y[r] = hsum8_ps(acc[r]);
}

}  // namespace

bool matvec_x8_avx512(DType t, const void* P, int n_in, int g0, int g1, const BlockQ8A* X, int n_x, float* Y,
                      size_t y_stride) {
  thread_local X8Row xr[kX8MaxActs];
  const int nb = n_in / QK;
  return x8_dispatch(t, [&](auto type) {
    constexpr DType T = decltype(type)::value;
    // vpdpbusd of the unsigned weights (q + bias) by x, started at -bias * (x's 4-sums).
    const auto isum = [](const X8Row& x, int b, __m256i u, const uint8_t*, int) {
      return _mm256_dpbusd_epi32(x.blocks[b].start, u, x.blocks[b].q);
    };
    const auto prep_row = [&](const BlockQ8A* x, X8Row& row) { prep<T>(x, nb, row); };
    rows_x8<T>(static_cast<const uint8_t*>(P), nb, g0, g1, X, n_x, xr, prep_row, isum, Y, y_stride);
  });
}

bool matvec_q_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* x, float* Y) {
  if (t != DType::Q8_0) return false;  // the other types keep the tile path
  thread_local X8Row xr;
  const int nb = n_in / QK;
  const size_t row_bytes = nb * sizeof(BlockQ8_0);
  prep<DType::Q8_0>(x, nb, xr);
  const auto* w = static_cast<const uint8_t*>(W);
  int o = o0;
  for (; o + kRows <= o1; o += kRows) rows<kRows>(w + o * row_bytes, row_bytes, nb, xr, Y + o);
  for (; o < o1; ++o) rows<1>(w + o * row_bytes, row_bytes, nb, xr, Y + o);
  return true;
}

}  // namespace ctx::qk
