// AVX-512 product of Q4_1 weights (SmolLM2's) with 3 to 15 activation rows:
// batched decode, one row per sequence, in the canonical order of quant.h.
//
// As in the one-row Q8_0 kernel (quant_decode_avx512.cpp), a 256-bit register
// holds one (weight row, activation row) pair's 8 canonical lanes, and per
// block and pair the work is one vpdpbusd (lane l: elements 4l..4l+3, exactly
// canonical lane l), one convert and one fma whose scale f16(d_w) * d_x comes
// from memory as an embedded broadcast. A weight block is loaded and unpacked
// once into a register and meets every activation row there (tiles of 4, 2 or
// 1 weight rows by 3-4, 5-8 or 9-15 activation rows: at most 16 accumulators).
// The scales of a chunk of 8 blocks are formed before the chunk runs, one zmm
// multiply per weight row and block (the rows' d_x in its lanes): a scale
// stored and broadcast back at once stalls on the store. The min sums
// summ = fma(f16(m_w), s_x, summ) run the same way, one zmm fma per weight
// row and block, blocks in order.
//
// (The tiles of quant_avx512.cpp pack two pairs a zmm, which needs their
// scale vector built per pair and block, and unpack each weight block once
// per group of 4 activation rows: on Zen 4, which splits zmm work in two
// halves, this kernel measured 1.2-1.3x their speed at 8-12 rows; at 2 rows
// it did not win, and from 16 rows quant_prefill_avx512.cpp is as fast. For
// Q4_0, Q5_0 and Q8_0 it measured no gain, so they keep the tiles.)
//
// vpdpbusd multiplies unsigned by signed bytes: the weight q (0..15) is the
// unsigned side, the activation the signed one, so the int32 lanes are the
// canonical isums as they come.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr int kMinRows = 3;
constexpr int kMaxRows = 15;
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

void prep(const BlockQ8A* X, int nb, int rows, XRows& xr) {
  xr.q.resize(static_cast<size_t>(nb) * rows);
  xr.d.assign(static_cast<size_t>(nb) * kLanes, 0.0f);
  xr.s.assign(static_cast<size_t>(nb) * kLanes, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < nb; ++b) {
      const BlockQ8A& x = X[static_cast<size_t>(r) * nb + b];
      xr.q[static_cast<size_t>(b) * rows + r].v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
      xr.d[static_cast<size_t>(b) * kLanes + r] = x.d;
      xr.s[static_cast<size_t>(b) * kLanes + r] = x.s;
    }
}

// A Q4_1 block's 32 weights q, in element order: elements 0..15 are the low
// nibbles, 16..31 the high ones.
inline __m256i unpack(const uint8_t* p) {
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
}

// The few float operations on the rows' lanes, on 8 or 16 of them.
struct Lanes8 {
  using V = __m256;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm256_store_ps(p, v); }
};
struct Lanes16 {
  using V = __m512;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
};

// Weight rows [0, NK) from w0 (row_bytes apart) against the R prepared rows.
template <int NK, int R>
void tile(const uint8_t* w0, size_t row_bytes, int nb, XView xr, float* Y, size_t y_stride) {
  constexpr size_t bb = sizeof(BlockQ4_1);
  __m256 acc[NK][R];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  // Up to 8 rows, the scales and min sums take 256-bit vectors (half the work on Zen 4).
  using L = std::conditional_t<(R <= 8), Lanes8, Lanes16>;
  typename L::V summ[NK];
  for (auto& s : summ) s = L::set1(0.0f);
  alignas(64) float sc[kChunk][NK][kLanes];
  for (int c = 0; c < nb; c += kChunk) {
    const int n = std::min(kChunk, nb - c);
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      const typename L::V dx = L::load(xr.d + b * kLanes), sx = L::load(xr.s + b * kLanes);
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        L::store(sc[i][k], L::mul(L::set1(_cvtsh_ss(load_u16(p))), dx));
        summ[k] = L::fma(L::set1(_cvtsh_ss(load_u16(p + 2))), sx, summ[k]);
      }
    }
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      __m256i w[NK];
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        // Decode streams every weight from memory once: ask for the next
        // tile's bytes at this offset while this one computes.
        _mm_prefetch(reinterpret_cast<const char*>(p + NK * row_bytes), _MM_HINT_T0);
        w[k] = unpack(p);
      }
      const XBlock* xq = xr.q + b * R;
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < NK; ++k) {
          const __m256i isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[k], xq[r].v);
          acc[k][r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[i][k][r]), _mm256_cvtepi32_ps(isum), acc[k][r]);
        }
    }
  }
  for (int k = 0; k < NK; ++k) {
    alignas(64) float m[kLanes];
    L::store(m, summ[k]);
    for (int r = 0; r < R; ++r) Y[r * y_stride + k] = hsum8_ps(acc[k][r]) + m[r];
  }
}

// Weight rows [o0, o1) in tiles of NK rows, the rest one by one.
template <int R>
void rows(const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, XView xr, float* Y, size_t y_stride) {
  constexpr int nk = R <= 4 ? 4 : R <= 8 ? 2 : 1;
  int o = o0;
  for (; o + nk <= o1; o += nk) tile<nk, R>(w + o * row_bytes, row_bytes, nb, xr, Y + o, y_stride);
  if constexpr (nk > 1)
    for (; o < o1; ++o) tile<1, R>(w + o * row_bytes, row_bytes, nb, xr, Y + o, y_stride);
}

template <int R = kMinRows>
void rows_for(int n_x, const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, XView xr, float* Y,
              size_t y_stride) {
  if constexpr (R < kMaxRows) {
    if (n_x != R) return rows_for<R + 1>(n_x, w, row_bytes, nb, o0, o1, xr, Y, y_stride);
  }
  rows<R>(w, row_bytes, nb, o0, o1, xr, Y, y_stride);
}

}  // namespace

bool matmul_q_rows_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                          size_t y_stride) {
  if (t != DType::Q4_1 || n_x < kMinRows || n_x > kMaxRows) return false;
  thread_local XRows xr;
  const int nb = n_in / QK;
  prep(Xq, nb, n_x, xr);
  const XView view{xr.q.data(), xr.d.data(), xr.s.data()};
  rows_for(n_x, static_cast<const uint8_t*>(W), nb * sizeof(BlockQ4_1), nb, o0, o1, view, Y, y_stride);
  return true;
}

}  // namespace ctx::qk
