// AVX2 kernels.
//
// Integer types: one ymm accumulator per (weight row, activation row) pair
// holds the 8 canonical lanes of quant.h. Per block, int32 lane l of the
// 4-sums is elements 4l..4l+3 of the block, i.e. exactly canonical lane l,
// and it goes into the accumulator with one fma by the block's scale; the end
// is hsum8, whose steps are the 128-bit halves, movehl and movehdup.
//
// The 4-sums come from vpmaddubsw (u8 x s8 -> pairs of products in int16)
// then vpmaddwd with ones (adjacent int16 pairs -> int32). vpmaddubsw
// saturates at +-32767, which these operands never reach:
//   Q4_1, Q5_1: q in 0..31, |x| <= 127: 2 * 31 * 127 = 7874
//   Q4_0, Q5_0, Q8_0 (sign trick: |w| as unsigned, x negated where w < 0, |w| <= 8, 16 or 128):
//         2 * 128 * 127 = 32512 < 32767
// so the int32 lanes are the exact canonical isum.
//
// Tiling: a tile is NW weight rows x NX activation rows, each pair with its
// own accumulator fed in canonical order, so tiling never changes a result.
// (From 4 activation rows on, integer prefill goes to quant_prefill_avx2.h;
// 2 to 10 rows of Q4_1 and 2 to 32 of Q8_0 to quant_rows_avx2.cpp.)
//
// Float types: the 16 canonical lanes of matmul_f live in two ymm per
// accumulator, "lo" = lanes 0-7, "hi" = lanes 8-15.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/prefetch.h"
#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

// hsum16 of lanes (lo, hi): the w = 8 step is exactly lo + hi, the rest is hsum8.
float hsum16_ps(__m256 lo, __m256 hi) { return hsum8_ps(_mm256_add_ps(lo, hi)); }

// ---------------------------------------------------------------------------
// Integer matmul

constexpr size_t block_bytes(DType t) { return block_bytes_q(t); }


// One weight block, unpacked: `u` is what goes into vpmaddubsw's unsigned
// operand (Q4_1, Q5_1: q; Q4_0, Q5_0, Q8_0: |w|), `sign` the signed weights
// whose signs are moved onto x (unused for Q4_1, Q5_1).
struct WBlock {
  __m256i u, sign;
  __m256 d;
  float m;  // Q4_1, Q5_1 only
};

template <DType T>
WBlock load_block(const uint8_t* p) {
  WBlock w;
  w.d = _mm256_set1_ps(_cvtsh_ss(load_u16(p)));
  if constexpr (T == DType::Q8_0) {
    w.sign = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    w.u = _mm256_abs_epi8(w.sign);
  } else {
    constexpr bool q5 = T == DType::Q5_0 || T == DType::Q5_1;
    constexpr size_t qs_offset = (has_min(T) ? 4 : 2) + (q5 ? 4 : 0);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_offset));
    // Bytes 0-15: low nibbles (elements 0-15), bytes 16-31: high nibbles (elements 16-31).
    __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    if constexpr (q5) nib = _mm256_or_si256(nib, _mm256_and_si256(bytes_from_bits(p + qs_offset - 4), _mm256_set1_epi8(0x10)));
    if constexpr (has_min(T)) {
      w.u = nib;
      w.m = _cvtsh_ss(load_u16(p + 2));
    } else {
      w.sign = _mm256_sub_epi8(nib, _mm256_set1_epi8(T == DType::Q4_0 ? 8 : 16));
      w.u = _mm256_abs_epi8(w.sign);
    }
  }
  return w;
}

// One block b for every pair of the tile.
template <DType T, int NW, int NX>
inline void block_step(const uint8_t* const* wrow, size_t offset, const BlockQ8A* const* xrow, int b,
                       __m256 (&acc)[NW][NX], float (&summ)[NW][NX]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int i = 0; i < NW; ++i) {
    const WBlock w = load_block<T>(wrow[i] + offset);
    for (int j = 0; j < NX; ++j) {
      const BlockQ8A& x = xrow[j][b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
      const __m256i pairs = has_min(T) ? _mm256_maddubs_epi16(w.u, xq)
                                             : _mm256_maddubs_epi16(w.u, _mm256_sign_epi8(xq, w.sign));
      const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
      const __m256 scale = _mm256_mul_ps(w.d, _mm256_set1_ps(x.d));
      acc[i][j] = _mm256_fmadd_ps(scale, isum, acc[i][j]);
      if (has_min(T)) summ[i][j] = std::fma(w.m, x.s, summ[i][j]);
    }
  }
}

template <DType T, int NW, int NX>
void tile_q(const uint8_t* w0, size_t row_bytes, int nb, const BlockQ8A* x0, float* Y, size_t y_stride) {
  constexpr size_t bb = block_bytes(T);
  const uint8_t* wrow[NW];
  for (int i = 0; i < NW; ++i) wrow[i] = w0 + i * row_bytes;
  const BlockQ8A* xrow[NX];
  for (int j = 0; j < NX; ++j) xrow[j] = x0 + static_cast<size_t>(j) * nb;
  __m256 acc[NW][NX];
  float summ[NW][NX];
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) {
      acc[i][j] = _mm256_setzero_ps();
      summ[i][j] = 0.0f;
    }
  // The single dependency chain per pair stalls behind each weight miss, so
  // ask for the next tile's bytes while this one computes: in address order,
  // block b its share of the next NW rows (one stream; quant_avx512.cpp's tile).
  const uint8_t* next = w0 + NW * row_bytes;
  for (int b = 0; b < nb; ++b) {
    prefetch_lines(next + NW * b * bb, next + NW * (b + 1) * bb);
    block_step<T, NW, NX>(wrow, b * bb, xrow, b, acc, summ);
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) {
      float dot = hsum8_ps(acc[i][j]);
      if (has_min(T)) dot = dot + summ[i][j];
      Y[j * y_stride + i] = dot;
    }
}

// ---------------------------------------------------------------------------
// Decode of Q8_0: one activation row. Q8_0 is the tied output matrix of most
// small models (Gemma 3 270M: 168 MB of its 247 MB a token), so this product
// sets the decode speed, and it must keep up with memory. The tile above forms
// every scale f16(d_w) * d_x with a scalar half conversion, a broadcast and a
// multiply per (row, block), about 5 cycles a block in all; here the scales of
// a row come 8 blocks at a time (one vcvtph2ps and one multiply, stored for
// the fmas to broadcast), each block's activations are loaded once for all
// the group's rows, and the next group's bytes are asked for while this one
// computes (quant_decode_avx512.cpp's plan, on AVX2's sign trick). The same
// canonical lanes and products as every path.
constexpr int kDecodeRows = 4;    // weight rows a group (4 measured 1.04-1.08x 8 on a Zen 3); x read once a group
constexpr int kDecodeChunk = 8;   // blocks whose scales are formed together

template <int NR>
void q8_0_decode_rows(const uint8_t* w0, size_t row_bytes, int nb, const BlockQ8A* x, const float* xd, float* y) {
  constexpr size_t bb = sizeof(BlockQ8_0);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NR];
  for (auto& a : acc) a = _mm256_setzero_ps();
  alignas(32) float d[NR][kDecodeChunk];
  for (int c = 0; c < nb; c += kDecodeChunk) {
    const int n = std::min(kDecodeChunk, nb - c);
    const __m256 dx = _mm256_loadu_ps(xd + c);  // xd is padded with zeros past nb
    for (int r = 0; r < NR; ++r) {
      // The chunk's f16 headers into one register (a vector load behind 16-bit
      // stores would wait for them: no store forwarding).
      const uint8_t* hp = w0 + r * row_bytes + static_cast<size_t>(c) * bb;
      // Past a short chunk's end the last block's header again (its lanes are never read).
      const size_t last = static_cast<size_t>(n - 1) * bb;
      const auto at = [&](int b) { return load_u16(hp + std::min(static_cast<size_t>(b) * bb, last)); };
      __m128i h = _mm_cvtsi32_si128(at(0));
      h = _mm_insert_epi16(h, at(1), 1);
      h = _mm_insert_epi16(h, at(2), 2);
      h = _mm_insert_epi16(h, at(3), 3);
      h = _mm_insert_epi16(h, at(4), 4);
      h = _mm_insert_epi16(h, at(5), 5);
      h = _mm_insert_epi16(h, at(6), 6);
      h = _mm_insert_epi16(h, at(7), 7);
      _mm256_store_ps(d[r], _mm256_mul_ps(_mm256_cvtph_ps(h), dx));
    }
    for (int b = c; b < c + n; ++b) {
      // The next group's rows, a group's worth spread over its blocks.
      const uint8_t* ahead = w0 + NR * row_bytes + static_cast<size_t>(b) * NR * bb;
      for (size_t off = 0; off < NR * bb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + r * row_bytes + b * bb + 2));
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xq, w));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d[r][b - c]), _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), acc[r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) y[r] = hsum8_ps(acc[r]);
}

void q8_0_decode(const void* W, int n_in, int o0, int o1, const BlockQ8A* x, float* Y) {
  const int nb = n_in / QK;
  const size_t row_bytes = nb * sizeof(BlockQ8_0);
  thread_local std::vector<float> xd;
  xd.assign(static_cast<size_t>(nb) + kDecodeChunk, 0.0f);
  for (int b = 0; b < nb; ++b) xd[b] = x[b].d;
  const auto* w = static_cast<const uint8_t*>(W);
  int o = o0;
  for (; o + kDecodeRows <= o1; o += kDecodeRows)
    q8_0_decode_rows<kDecodeRows>(w + o * row_bytes, row_bytes, nb, x, xd.data(), Y + o);
  for (; o < o1; ++o) q8_0_decode_rows<1>(w + o * row_bytes, row_bytes, nb, x, xd.data(), Y + o);
}

using TileQFn = void (*)(const uint8_t*, size_t, int, const BlockQ8A*, float*, size_t);

// Tile shapes: 4 weight rows for a single activation row (decode: four
// weight streams in flight), 2 x 2 otherwise (weights reused from registers).
template <DType T>
void matmul_q_impl(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride) {
  const int nb = n_in / QK;
  const size_t row_bytes = nb * block_bytes(T);
  const auto* wbase = static_cast<const uint8_t*>(W);
  static constexpr TileQFn by_nw_1x[4] = {tile_q<T, 1, 1>, tile_q<T, 2, 1>, tile_q<T, 3, 1>, tile_q<T, 4, 1>};
  static constexpr TileQFn by_nw_nx[2][2] = {{tile_q<T, 1, 1>, tile_q<T, 1, 2>}, {tile_q<T, 2, 1>, tile_q<T, 2, 2>}};
  if (T == DType::Q8_0 && n_x == 1) return q8_0_decode(W, n_in, o0, o1, Xq, Y);
  const int step_w = n_x == 1 ? 4 : 2;
  for (int o = o0; o < o1; o += step_w) {
    const int nw = std::min(step_w, o1 - o);
    const uint8_t* w0 = wbase + o * row_bytes;
    if (n_x == 1) {
      by_nw_1x[nw - 1](w0, row_bytes, nb, Xq, Y + o, y_stride);
      continue;
    }
    for (int r = 0; r < n_x; r += 2)
      by_nw_nx[nw - 1][std::min(2, n_x - r) - 1](w0, row_bytes, nb, Xq + static_cast<size_t>(r) * nb,
                                                 Y + r * y_stride + o, y_stride);
  }
}

// ---------------------------------------------------------------------------
// Float matmul: acc[i % 16] = fma(w[i], x[i], acc[i % 16]); elements 16e..16e+7
// go to lo, 16e+8..16e+15 to hi. The n_in % 16 tail is finished in scalar on
// the spilled lanes (std::fma is the same single rounding).

// 8 weights as floats: f32, f16 or bf16 elements (Q8_0 rows: tile_f_q8_0).
template <DType T>
__m256 load_w8(const void* row, int i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (T == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16: exact widening
  }
}

// One weight (the n_in % 16 tail).
template <DType T>
float load_w1(const void* row, int i) {
  if constexpr (T == DType::F32) return static_cast<const float*>(row)[i];
  const uint16_t h = static_cast<const uint16_t*>(row)[i];
  if constexpr (T == DType::F16) return _cvtsh_ss(h);
  return bf16_to_f32(h);
}

template <DType T, int NW, int NX>
void tile_f(const uint8_t* w0, size_t row_bytes, int n_in, const float* x0, float* Y, size_t y_stride) {
  __m256 lo[NW][NX], hi[NW][NX];
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  const int n16 = n_in / 16 * 16;
  for (int e = 0; e < n16; e += 16) {
    __m256 wl[NW], wh[NW];
    for (int i = 0; i < NW; ++i) {
      wl[i] = load_w8<T>(w0 + i * row_bytes, e);
      wh[i] = load_w8<T>(w0 + i * row_bytes, e + 8);
    }
    for (int j = 0; j < NX; ++j) {
      const float* x = x0 + static_cast<size_t>(j) * n_in + e;
      const __m256 xl = _mm256_loadu_ps(x), xh = _mm256_loadu_ps(x + 8);
      for (int i = 0; i < NW; ++i) {
        lo[i][j] = _mm256_fmadd_ps(wl[i], xl, lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(wh[i], xh, hi[i][j]);
      }
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) {
      if (n16 == n_in) {
        Y[j * y_stride + i] = hsum16_ps(lo[i][j], hi[i][j]);
        continue;
      }
      alignas(32) float a[16];
      _mm256_store_ps(a, lo[i][j]);
      _mm256_store_ps(a + 8, hi[i][j]);
      const float* x = x0 + static_cast<size_t>(j) * n_in;
      for (int e = n16; e < n_in; ++e) a[e % 16] = std::fma(load_w1<T>(w0 + i * row_bytes, e), x[e], a[e % 16]);
      Y[j * y_stride + i] = hsum16(a);
    }
}

// tile_f for Q8_0 rows, a block of 32 at a time: each row's scale is widened
// once per block (not per 8 weights, which also spilled the accumulators of a
// 4-row tile to the stack), and each weight is still f16(d) * q, exact, added
// into lane e % 16 in ascending e (quant.h's float order): the same bits.
template <int NW, int NX>
void tile_f_q8_0(const uint8_t* w0, size_t row_bytes, int n_in, const float* x0, float* Y, size_t y_stride) {
  __m256 lo[NW][NX], hi[NW][NX];
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  const auto widen = [](const uint8_t* q, __m256 d) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d);
  };
  for (int b = 0; b < n_in / QK; ++b) {
    for (int i = 0; i < NW; ++i) {
      const uint8_t* blk = w0 + i * row_bytes + static_cast<size_t>(b) * sizeof(BlockQ8_0);
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
      for (int h = 0; h < 2; ++h) {  // elements 16h..16h+7 to lo, 16h+8..16h+15 to hi
        const __m256 wl = widen(blk + 2 + 16 * h, d), wh = widen(blk + 2 + 16 * h + 8, d);
        for (int j = 0; j < NX; ++j) {
          const float* x = x0 + static_cast<size_t>(j) * n_in + b * QK + 16 * h;
          lo[i][j] = _mm256_fmadd_ps(wl, _mm256_loadu_ps(x), lo[i][j]);
          hi[i][j] = _mm256_fmadd_ps(wh, _mm256_loadu_ps(x + 8), hi[i][j]);
        }
      }
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) Y[j * y_stride + i] = hsum16_ps(lo[i][j], hi[i][j]);
}

using TileFFn = void (*)(const uint8_t*, size_t, int, const float*, float*, size_t);

template <DType T, int NW, int NX>
constexpr TileFFn tile_f_for() {
  if constexpr (T == DType::Q8_0) return tile_f_q8_0<NW, NX>;
  else return tile_f<T, NW, NX>;
}

template <DType T>
void matmul_f_impl(const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y, size_t y_stride) {
  const size_t row_bytes = dtype_row_bytes(T, n_in);
  const auto* wbase = static_cast<const uint8_t*>(W);
  static constexpr TileFFn by_nw_1x[4] = {tile_f_for<T, 1, 1>(), tile_f_for<T, 2, 1>(), tile_f_for<T, 3, 1>(),
                                          tile_f_for<T, 4, 1>()};
  static constexpr TileFFn by_nw_nx[2][2] = {{tile_f_for<T, 1, 1>(), tile_f_for<T, 1, 2>()},
                                             {tile_f_for<T, 2, 1>(), tile_f_for<T, 2, 2>()}};
  const int step_w = n_x == 1 ? 4 : 2;
  for (int o = o0; o < o1; o += step_w) {
    const int nw = std::min(step_w, o1 - o);
    const uint8_t* w0 = wbase + o * row_bytes;
    if (n_x == 1) {
      by_nw_1x[nw - 1](w0, row_bytes, n_in, Xf, Y + o, y_stride);
      continue;
    }
    for (int r = 0; r < n_x; r += 2)
      by_nw_nx[nw - 1][std::min(2, n_x - r) - 1](w0, row_bytes, n_in, Xf + static_cast<size_t>(r) * n_in,
                                                 Y + r * y_stride + o, y_stride);
  }
}

}  // namespace

void matmul_q_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                   size_t y_stride, uint64_t x_id) {
  // Q4_1 with 2 to 10 rows and Q8_0 with 2 to 32 (a verified draft, batched
  // decode) have their own kernel (quant_rows_avx2.cpp). From 4 activation rows on,
  // unpacking each weight tile once (to memory) beats unpacking it per tile
  // of 2 x 2 pairs (quant_prefill_avx2.h, built with and without AVX-VNNI).
  if (matmul_q_rows_avx2(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride)) return;
  if (n_x >= 4) {
    const auto prefill = avx2_vnni() ? matmul_q_prefill_avxvnni : matmul_q_prefill_avx2;
    return prefill(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  }
  switch (t) {
    case DType::Q4_0: return matmul_q_impl<DType::Q4_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q4_1: return matmul_q_impl<DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_0: return matmul_q_impl<DType::Q5_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_1: return matmul_q_impl<DType::Q5_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    default: return matmul_q_impl<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
  }
}

void matmul_f_avx2(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                   size_t y_stride) {
  switch (t) {
    case DType::F32: return matmul_f_impl<DType::F32>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::F16: return matmul_f_impl<DType::F16>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::BF16: return matmul_f_impl<DType::BF16>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    default: return matmul_f_impl<DType::Q8_0>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
  }
}

// ---------------------------------------------------------------------------
// Attention helpers

void f32_to_f16_row_avx2(const float* x, uint16_t* y, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = f32_to_f16(x[i]);  // scalar rounding is bit-identical to F16C's
}

}  // namespace ctx::qk
