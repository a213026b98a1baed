// AVX-512 products of Q8_0 weights (the tied output matrix of SmolLM2 and
// Gemma 3: 168 MB of Gemma's 247 MB a token) with 4 to 8 activation rows
// (batched decode: one row per sequence), on cores whose zmm operations are
// whole (Intel: prefill_tiles() == zmm), in the canonical order of quant.h.
//
// The rows kernel of quant_rows_avx512.cpp holds one (weight row, activation
// row) pair's 8 canonical lanes in a ymm, which suits Zen 4 (it splits zmm
// work in two halves). Intel retires a zmm vpdpbusd, convert and fma at
// nearly the ymm rate (bench/int8_peak.c), so here a zmm holds two pairs: one
// weight row against two activation rows, [pair(k, 2j) | pair(k, 2j + 1)].
// A weight block is loaded once into both halves and meets every pair of
// rows; per zmm the work is one vpdpbusd, one convert, the two scales
// f16(d_w) * d_x (one multiply: d_w broadcast, the rows' d_x prepared as
// [d_x(2j) x 8 | d_x(2j + 1) x 8]) and one fma. Every lane gets exactly its
// canonical operations, blocks in order, and each pair's hsum8 is taken in
// hsum8's order, so the results are the other paths' bits. (Measured on an
// Intel Xeon, 2 threads, Gemma 3's output matrix at 8 rows: 11.2 ms against
// the ymm kernel's 13.6; Q4_1 gained nothing, and from 9 rows the prefill
// tiles are as fast on SmolLM2's output, so they keep those.)
//
// vpdpbusd multiplies unsigned by signed bytes: the weight biased by 128 (q
// with its sign bit flipped) is the unsigned side, the activation the signed
// one, and each pair's vpdpbusd starts from -128 * (the activation's 4-sums),
// prepared with the rows, which takes the bias back exactly in int32.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr int kMinRows = 4;  // at 3 the half-empty second pair costs what the ymm kernel gains
constexpr int kMaxRows = 8;
constexpr int kMaxPairs = kMaxRows / 2;
constexpr int kNK = 4;  // weight rows a tile: with 4 pairs of rows, 16 accumulators
constexpr size_t kBlockBytes = sizeof(BlockQ8_0);

struct alignas(64) Pair {
  __m512i q;  // rows 2j, 2j + 1's 32 int8 of a block
  __m512i c;  // where their vpdpbusd starts: -128 * each row's 4-sums
  __m512 d;   // d_x of row 2j in lanes 0-7, of 2j + 1 in lanes 8-15
};

// The activation rows by pairs, [block][pair] (an odd count's last pair has
// a zero row beside it: scale 0, never stored), prepared once per call.
void prep(const BlockQ8A* X, int nb, int rows, std::vector<Pair>& xr) {
  const int pairs = (rows + 1) / 2;
  xr.resize(static_cast<size_t>(nb) * pairs);
  for (int b = 0; b < nb; ++b)
    for (int j = 0; j < pairs; ++j) {
      __m256i q[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      float d[2] = {0.0f, 0.0f};
      for (int h = 0; h < 2 && 2 * j + h < rows; ++h) {
        const BlockQ8A& x = X[static_cast<size_t>(2 * j + h) * nb + b];
        q[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
        d[h] = x.d;
      }
      Pair& p = xr[static_cast<size_t>(b) * pairs + j];
      p.q = _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1);
      p.c = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), p.q));
      p.d = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d[0])), _mm256_set1_ps(d[1]), 1);
    }
}

// hsum8 of each 256-bit half (lanes i + 4, then i + 2, then i + 1): the
// lower half's sum in lane 0, the upper's in lane 8.
inline __m512 hsum8_halves(__m512 a) {
  const __m512 s4 = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(s2, _mm512_movehdup_ps(s2));
}

// Weight rows [0, NK) from w0 (row_bytes apart) against P prepared pairs of
// rows (R rows in all).
template <int NK, int P>
void tile(const uint8_t* w0, size_t row_bytes, int nb, const Pair* xr, int R, float* Y, size_t y_stride) {
  __m512 acc[NK][P];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(-128);
  for (int b = 0; b < nb; ++b) {
    __m512i w[NK];
    __m512 dw[NK];
    for (int k = 0; k < NK; ++k) {
      const uint8_t* p = w0 + k * row_bytes + static_cast<size_t>(b) * kBlockBytes;
      // Decode streams every weight from memory once: ask for the next
      // tile's bytes at this offset while this one computes.
      _mm_prefetch(reinterpret_cast<const char*>(p + NK * row_bytes), _MM_HINT_T0);
      w[k] = _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2))), flip);
      dw[k] = _mm512_set1_ps(_cvtsh_ss(load_u16(p)));
    }
    const Pair* x = xr + static_cast<size_t>(b) * P;
    for (int j = 0; j < P; ++j)
      for (int k = 0; k < NK; ++k) {
        const __m512i isum = _mm512_dpbusd_epi32(x[j].c, w[k], x[j].q);
        acc[k][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[k], x[j].d), _mm512_cvtepi32_ps(isum), acc[k][j]);
      }
  }
  for (int k = 0; k < NK; ++k)
    for (int j = 0; j < P; ++j) {
      alignas(64) float h[16];
      _mm512_store_ps(h, hsum8_halves(acc[k][j]));
      Y[2 * j * y_stride + k] = h[0];
      if (2 * j + 1 < R) Y[(2 * j + 1) * y_stride + k] = h[8];
    }
}

template <int P>
void rows(const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, const Pair* xr, int R, float* Y,
          size_t y_stride) {
  int o = o0;
  for (; o + kNK <= o1; o += kNK) tile<kNK, P>(w + o * row_bytes, row_bytes, nb, xr, R, Y + o, y_stride);
  for (; o < o1; ++o) tile<1, P>(w + o * row_bytes, row_bytes, nb, xr, R, Y + o, y_stride);
}

template <int P = (kMinRows + 1) / 2>
void rows_for(int pairs, const uint8_t* w, size_t row_bytes, int nb, int o0, int o1, const Pair* xr, int R, float* Y,
              size_t y_stride) {
  if constexpr (P < kMaxPairs) {
    if (pairs != P) return rows_for<P + 1>(pairs, w, row_bytes, nb, o0, o1, xr, R, Y, y_stride);
  }
  rows<P>(w, row_bytes, nb, o0, o1, xr, R, Y, y_stride);
}

}  // namespace

bool matmul_q8_rows_zmm_avx512(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                               size_t y_stride) {
  if (n_x < kMinRows || n_x > kMaxRows) return false;
  thread_local std::vector<Pair> xr;
  const int nb = n_in / QK;
  prep(Xq, nb, n_x, xr);
  rows_for((n_x + 1) / 2, static_cast<const uint8_t*>(W), nb * kBlockBytes, nb, o0, o1, xr.data(), n_x, Y, y_stride);
  return true;
}

}  // namespace ctx::qk
