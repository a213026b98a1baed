// AVX-512 products of Q4_1 weights (SmolLM2's layers) with 2 to 16 activation
// rows and of Q8_0 weights (SmolLM2's and Gemma 3's tied output, Gemma's
// attn_v) with 2 to 32: batched decode, one row per sequence, in the canonical
// order of quant.h.
//
// As in the one-row Q8_0 kernel (quant_decode_avx512.cpp), a 256-bit register
// holds one (weight row, activation row) pair's 8 canonical lanes, and per
// block and pair the work is one vpdpbusd (lane l: elements 4l..4l+3, exactly
// canonical lane l), one convert and one fma whose scale f16(d_w) * d_x comes
// from memory as an embedded broadcast. A weight block is loaded and unpacked
// once into a register and meets every activation row there (tiles of 4, 2 or
// 1 weight rows by 2-4, 5-8 or 9-16 activation rows: at most 16 accumulators).
// Q8_0's 17-32 rows go as two groups, by bands of weight rows that meet both
// while in L2, so the weights still come from memory once (by_row_groups).
// The scales of a chunk of 8 blocks are formed before the chunk runs, one
// vector multiply per weight row and block (the rows' d_x in its lanes, 8 or
// 16 of them): a scale stored and broadcast back at once stalls on the store.
// Q4_1's min sums summ = fma(f16(m_w), s_x, summ) run the same way, one fma
// per weight row and block, blocks in order.
//
// (The tiles of quant_avx512.cpp pack two pairs a zmm, which needs their
// scale vector built per pair and block, and unpack each weight block once
// per group of 4 activation rows (Q4_1) or 8 (Q8_0): on Zen 4, which splits
// zmm work in two halves, this kernel measured 1.2-1.3x their speed at 8-12
// rows on Q4_1 and 1.1-1.2x on Q8_0. At 2 rows it did not win until its
// tiles asked for the weights ahead in one stream (prefetch.h): since then
// 2 streams of Gemma 3 run 1.29x, of SmolLM2 1.14x, and 3-4 streams of
// Gemma 3 1.22-1.36x (Zen 4, 2 threads, session 42). From 16 rows
// quant_prefill_avx512.cpp is as fast on weights in cache, but not on weights
// streamed from memory, as decode's are: quant_avx512.cpp says which runs.
// Q4_0, Q5_0 and Q5_1 keep the tiles: Q5_0 measured no gain, the other two
// are in none of our models.)
//
// vpdpbusd multiplies unsigned by signed bytes. Q4_1: the weight q (0..15)
// is the unsigned side, the activation the signed one. Q8_0: the activation
// biased by 128 is the unsigned side, the weight the signed one, and the
// accumulator starts at -128 * (the weight's 4-sums), which takes the bias
// back exactly in int32 (as quant_prefill_avx512.cpp does). Either way the
// int32 lanes are the exact canonical isums.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/prefetch.h"
#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"
#include "kernels/simd_f32.h"

namespace ctx::qk {

namespace {

constexpr int kMinRows = 2;
constexpr int kMaxRows = 16;  // rows a tile takes (Q8_0 twice that: simd_common.h's by_row_groups)
constexpr int kLanes = 16;  // rows' d_x / s_x in one zmm
constexpr int kChunk = 8;   // blocks whose scales are formed together

struct XBlock {
  __m256i v;  // one activation block's 32 int8
};
// The activation rows, prepared once per call.
struct XRows {
  std::vector<XBlock> q;  // [block][row]
  std::vector<float> d;   // [block][kLanes]: d_x of each row (0 past the last row)
  std::vector<float> s;   // [block][kLanes]: s_x of each row
};
// The same as plain pointers: the kernels never touch the thread_local XRows
// (whose address GCC would otherwise look up again per block).
struct XView {
  const XBlock* q;
  const float* d;
  const float* s;
};

template <DType T>
void prep(const BlockQ8A* X, int nb, int rows, XRows& xr) {
  xr.q.resize(static_cast<size_t>(nb) * rows);
  xr.d.assign(static_cast<size_t>(nb) * kLanes, 0.0f);
  xr.s.assign(static_cast<size_t>(nb) * kLanes, 0.0f);
  const __m256i flip = _mm256_set1_epi8(T == DType::Q8_0 ? -128 : 0);  // Q8_0: x + 128 (the sign bit flipped)
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < nb; ++b) {
      const BlockQ8A& x = X[static_cast<size_t>(r) * nb + b];
      xr.q[static_cast<size_t>(b) * rows + r].v =
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs)), flip);
      xr.d[static_cast<size_t>(b) * kLanes + r] = x.d;
      xr.s[static_cast<size_t>(b) * kLanes + r] = x.s;
    }
}

// A block's 32 weights, in element order. Q4_1: q (elements 0..15 are the
// low nibbles, 16..31 the high ones). Q8_0: the signed q, and start = -128 *
// its 4-sums.
template <DType T>
inline __m256i unpack(const uint8_t* p, __m256i& start) {
  if constexpr (T == DType::Q8_0) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    start = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), q));
    return q;
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    start = _mm256_setzero_si256();
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
  }
}

// Weight rows [0, NK) from w0 (row_bytes apart) against the R prepared rows.
template <DType T, int NK, int R>
void tile(const uint8_t* w0, size_t row_bytes, int nb, XView xr, float* Y, size_t y_stride) {
  constexpr size_t bb = block_bytes_q(T);
  __m256 acc[NK][R];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  // Up to 8 rows, the scales and min sums take 256-bit vectors (half the work on Zen 4).
  using L = std::conditional_t<(R <= 8), F32x8, F32x16>;
  typename L::F summ[NK];
  for (auto& s : summ) s = L::zero();
  alignas(64) float sc[kChunk][NK][kLanes];
  // Decode streams every weight from memory once: block b asks for its
  // share of the tile a few on (prefetch.h).
  const uint8_t* ahead = w0 + weight_tiles_ahead(R, NK * row_bytes) * NK * row_bytes;
  for (int c = 0; c < nb; c += kChunk) {
    const int n = std::min(kChunk, nb - c);
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      const typename L::F dx = L::loadu(xr.d + b * kLanes), sx = L::loadu(xr.s + b * kLanes);
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        L::storeu(sc[i][k], L::mul(L::set1(_cvtsh_ss(load_u16(p))), dx));
        if constexpr (has_min(T)) summ[k] = L::fma(L::set1(_cvtsh_ss(load_u16(p + 2))), sx, summ[k]);
      }
    }
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      prefetch_lines(ahead + b * NK * bb, ahead + (b + 1) * NK * bb);
      __m256i w[NK], start[NK];
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        w[k] = unpack<T>(p, start[k]);
      }
      const XBlock* xq = xr.q + b * R;
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < NK; ++k) {
          const __m256i isum = has_min(T) ? _mm256_dpbusd_epi32(start[k], w[k], xq[r].v)
                                          : _mm256_dpbusd_epi32(start[k], xq[r].v, w[k]);
          acc[k][r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[i][k][r]), _mm256_cvtepi32_ps(isum), acc[k][r]);
        }
    }
  }
  for (int k = 0; k < NK; ++k) {
    alignas(64) float m[kLanes];
    L::storeu(m, summ[k]);
    for (int r = 0; r < R; ++r) Y[r * y_stride + k] = has_min(T) ? hsum8_ps(acc[k][r]) + m[r] : hsum8_ps(acc[k][r]);
  }
}

// Weight rows [o0, o1) in tiles of NK rows, the rest one by one; between
// tiles, a line of the reader's (if any) for each block a tile multiplies.
template <DType T, int R>
void rows(const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, XView xr, ReadAhead* ra, float* Y,
          size_t y_stride) {
  constexpr int nk = R <= 4 ? 4 : R <= 8 ? 2 : 1;
  int o = o0;
  for (; o + nk <= o1; o += nk) {
    read_ahead_lines(ra, nb);
    tile<T, nk, R>(w + o * row_bytes, row_bytes, nb, xr, Y + o, y_stride);
  }
  if constexpr (nk > 1)
    for (; o < o1; ++o) tile<T, 1, R>(w + o * row_bytes, row_bytes, nb, xr, Y + o, y_stride);
}

template <DType T, int R = kMinRows>
void rows_for(int n_x, const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, XView xr, ReadAhead* ra,
              float* Y, size_t y_stride) {
  if constexpr (R < kMaxRows) {
    if (n_x != R) return rows_for<T, R + 1>(n_x, w, row_bytes, nb, o0, o1, xr, ra, Y, y_stride);
  }
  rows<T, R>(w, row_bytes, nb, o0, o1, xr, ra, Y, y_stride);
}

template <DType T>
void matmul_rows(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride) {
  thread_local XRows xr[2];
  XView view[2];
  ReadAhead* const ra = read_ahead();
  const int nb = n_in / QK;
  const size_t row_bytes = static_cast<size_t>(nb) * block_bytes_q(T);
  by_row_groups(
      n_x, kMaxRows, o0, o1, row_bytes,
      [&](int g, int first, int rows) {
        prep<T>(Xq + static_cast<size_t>(first) * nb, nb, rows, xr[g]);
        view[g] = {xr[g].q.data(), xr[g].d.data(), xr[g].s.data()};
      },
      [&](int g, int first, int rows, int b0, int b1) {
        rows_for<T>(rows, static_cast<const uint8_t*>(W), row_bytes, nb, b0, b1, view[g], ra,
                    Y + static_cast<size_t>(first) * y_stride, y_stride);
      });
}

}  // namespace

bool matmul_q_rows_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                          size_t y_stride) {
  if (n_x < kMinRows || n_x > (t == DType::Q8_0 ? 2 * kMaxRows : kMaxRows)) return false;
  if (t == DType::Q4_1) return matmul_rows<DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride), true;
  if (t == DType::Q8_0) return matmul_rows<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride), true;
  return false;
}

}  // namespace ctx::qk
