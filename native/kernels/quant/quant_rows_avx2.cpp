// AVX2 products of Q4_1 weights (SmolLM2's layers) with 2 to 10 activation
// rows and of Q8_0 weights (SmolLM2's and Gemma 3's tied output, Gemma's
// attn_v) with 2 to 32: a verified draft, or batched decode, in the canonical
// order of quant.h. quant_rows_avx512.cpp's plan on AVX2's integer products.
//
// A ymm holds one (weight row, activation row) pair's 8 canonical lanes; per
// block and pair the work is the 4-sums (vpmaddubsw, then vpmaddwd with ones:
// lane l is elements 4l..4l+3, exactly canonical lane l), one convert and one
// fma whose scale f16(d_w) * d_x is broadcast from a table. A weight block is
// loaded and unpacked once into a register and meets every activation row
// there (tiles of 2 weight rows by 2-4 activation rows, of 1 by 5 or more).
// The scales of a chunk of 8 blocks are formed before the chunk runs, one
// vector multiply per weight row, block and 8 activation rows (their d_x in
// its lanes); Q4_1's min sums summ = fma(f16(m_w), s_x, summ) run the same
// way, one fma per weight row and block, blocks in order.
//
// What it replaces on AVX2: 3 rows took quant_avx2.cpp's 2 x 2 register
// tiles, which form every scale with a scalar conversion, a broadcast and a
// multiply per pair and block; from 4 rows the prefill driver
// (quant_prefill_avx2.h), which unpacks each tile of weights to memory and
// builds its scale table in a pass of its own, work that a few rows do not
// repay. Each row count's time against one row's, in one process (Zen 3, one
// thread; docs/PERFORMANCE.md, session 33): Q4_1 1.04-1.42x faster at 3 to 10
// rows, 0.88-0.96x at 12 to 16 (so those stay with the driver); Q8_0
// 1.10-1.37x at 3 to 16. At 2 rows it tied with the register tiles until
// its tiles asked for the weights ahead in one stream (prefetch.h); since
// then it takes 2 rows too: 2 streams of Gemma 3 1.19x, of SmolLM2 1.07x
// (Zen 4 forced to AVX2, 2 threads, session 42).
//
// The activations' preparation (XRows, prep) repeats quant_rows_avx512.cpp's
// without its VNNI bias: shared through a header, a change to either would
// need an AVX-512 machine to test the other (every ISA unit keeps its own
// copies in an anonymous namespace: docs/architecture.md).
//
// vpmaddubsw multiplies unsigned by signed bytes. Q4_1: the weight q (0..15)
// is the unsigned side, the activation the signed one (2 * 15 * 127 fits an
// int16). Q8_0: the sign trick, |w| unsigned and x negated where w < 0
// (2 * 128 * 127 = 32512 fits).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/prefetch.h"
#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"
#include "kernels/simd_f32.h"

namespace ctx::qk {

namespace {

constexpr int kMinRows = 2;
// The most rows a type's tiles take: past 10, Q4_1's single weight row with
// as many accumulators spills (0.88-0.96x the prefill driver at 12-16 rows),
// where Q8_0's still gains (1.10x at 16).
constexpr int max_rows(DType t) { return t == DType::Q4_1 ? 10 : 16; }
constexpr int kLanes = 16;  // rows' d_x / s_x in two ymm
constexpr int kChunk = 8;   // blocks whose scales are formed together
using L = F32x8;

struct XBlock {
  __m256i v;  // one activation block's 32 int8
};
// The activation rows, prepared once per call.
struct XRows {
  std::vector<XBlock> q;  // [block][row]
  std::vector<float> d;   // [block][kLanes]: d_x of each row (0 past the last row)
  std::vector<float> s;   // [block][kLanes]: s_x of each row
};
// The same as plain pointers: the kernels never touch the thread_local XRows.
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

// A block's weights as vpmaddubsw's unsigned operand: Q4_1's q (elements
// 0..15 are the low nibbles, 16..31 the high ones); Q8_0's |w|, with the
// signed w (whose signs go onto x) in sign.
template <DType T>
inline __m256i unpack(const uint8_t* p, __m256i& sign) {
  if constexpr (T == DType::Q8_0) {
    sign = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    return _mm256_abs_epi8(sign);
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    sign = _mm256_setzero_si256();
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
  }
}

// Weight rows [0, NK) from w0 (row_bytes apart) against the R prepared rows.
template <DType T, int NK, int R>
void tile(const uint8_t* w0, size_t row_bytes, int nb, XView xr, float* Y, size_t y_stride) {
  constexpr size_t bb = block_bytes_q(T);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NK][R];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  constexpr int H = (R + L::kLanes - 1) / L::kLanes;  // vectors of the rows' scales
  L::F summ[NK][H];
  for (auto& row : summ)
    for (auto& s : row) s = L::zero();
  alignas(32) float sc[kChunk][NK][kLanes];
  // Decode streams every weight from memory once: block b asks for its
  // share of the tile a few on (prefetch.h).
  const uint8_t* ahead = w0 + weight_tiles_ahead(R, NK * row_bytes) * NK * row_bytes;
  for (int c = 0; c < nb; c += kChunk) {
    const int n = std::min(kChunk, nb - c);
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        const L::F dw = L::set1(_cvtsh_ss(load_u16(p)));
        const L::F mw = has_min(T) ? L::set1(_cvtsh_ss(load_u16(p + 2))) : L::zero();
        for (int h = 0; h < H; ++h) {
          const size_t at = b * kLanes + h * L::kLanes;
          L::storeu(sc[i][k] + h * L::kLanes, L::mul(dw, L::loadu(xr.d + at)));
          if constexpr (has_min(T)) summ[k][h] = L::fma(mw, L::loadu(xr.s + at), summ[k][h]);
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      prefetch_lines(ahead + b * NK * bb, ahead + (b + 1) * NK * bb);
      __m256i u[NK], sign[NK];
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        u[k] = unpack<T>(p, sign[k]);
      }
      const XBlock* xq = xr.q + b * R;
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < NK; ++k) {
          const __m256i q = T == DType::Q8_0 ? _mm256_sign_epi8(xq[r].v, sign[k]) : xq[r].v;
          const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], q), ones);
          acc[k][r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[i][k][r]), _mm256_cvtepi32_ps(isum), acc[k][r]);
        }
    }
  }
  for (int k = 0; k < NK; ++k) {
    alignas(32) float m[kLanes];
    for (int h = 0; h < H; ++h) L::storeu(m + h * L::kLanes, summ[k][h]);
    for (int r = 0; r < R; ++r) Y[r * y_stride + k] = has_min(T) ? hsum8_ps(acc[k][r]) + m[r] : hsum8_ps(acc[k][r]);
  }
}

// Weight rows [o0, o1) in tiles of NK rows, the rest one by one.
template <DType T, int R>
void rows(const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, XView xr, float* Y, size_t y_stride) {
  constexpr int nk = R <= 4 ? 2 : 1;
  int o = o0;
  for (; o + nk <= o1; o += nk) tile<T, nk, R>(w + o * row_bytes, row_bytes, nb, xr, Y + o, y_stride);
  if constexpr (nk > 1)
    for (; o < o1; ++o) tile<T, 1, R>(w + o * row_bytes, row_bytes, nb, xr, Y + o, y_stride);
}

template <DType T, int R = kMinRows>
void rows_for(int n_x, const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, XView xr, float* Y,
              size_t y_stride) {
  if constexpr (R < max_rows(T)) {
    if (n_x != R) return rows_for<T, R + 1>(n_x, w, row_bytes, nb, o0, o1, xr, Y, y_stride);
  }
  rows<T, R>(w, row_bytes, nb, o0, o1, xr, Y, y_stride);
}

// The most rows one call takes: Q8_0's past 16 go as two groups, by bands of
// weight rows that meet both while in L2 (simd_common.h's by_row_groups).
constexpr int max_call_rows(DType t) { return t == DType::Q8_0 ? 2 * max_rows(t) : max_rows(t); }

template <DType T>
void matmul_rows(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride) {
  thread_local XRows xr[2];
  XView view[2];
  const int nb = n_in / QK;
  const size_t row_bytes = static_cast<size_t>(nb) * block_bytes_q(T);
  by_row_groups(
      n_x, max_rows(T), o0, o1, row_bytes,
      [&](int g, int first, int rows) {
        prep(Xq + static_cast<size_t>(first) * nb, nb, rows, xr[g]);
        view[g] = {xr[g].q.data(), xr[g].d.data(), xr[g].s.data()};
      },
      [&](int g, int first, int rows, int b0, int b1) {
        rows_for<T>(rows, static_cast<const uint8_t*>(W), row_bytes, nb, b0, b1, view[g],
                    Y + static_cast<size_t>(first) * y_stride, y_stride);
      });
}

}  // namespace

bool matmul_q_rows_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                        size_t y_stride) {
  if ((t != DType::Q4_1 && t != DType::Q8_0) || n_x < kMinRows || n_x > max_call_rows(t)) return false;
  if (t == DType::Q4_1) return matmul_rows<DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride), true;
  if (t == DType::Q8_0) return matmul_rows<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride), true;
  return false;
}

}  // namespace ctx::qk
