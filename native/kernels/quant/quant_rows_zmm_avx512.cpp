// AVX-512 products of Q8_0 weights (the tied output of SmolLM2 and Gemma 3,
// Gemma's attn_v) with 9 to 16 activation rows: batched decode, one row a
// sequence, where the 512-bit units are whole (prefill_tiles() == zmm).
// quant_rows_avx512.cpp's kernel with two pairs a zmm, as the prefill's zmm
// tiles hold them.
//
// Weight row k against activation rows 2p and 2p + 1 is one zmm: lane 2l + h
// is row 2p + h's canonical lane l (elements 4l..4l+3 of the block), the
// activation pair's dwords interleaved once per call and the weight block's
// doubled in a register. Per block and (weight row, pair of rows) the work is
// one vpdpbusd, one convert and one fma whose two scales f16(d_w) * d_x come
// in one 64-bit broadcast. A weight block is loaded and unpacked once, in a
// register, and meets every activation row there; the prefill tiles instead
// write each unpacked tile and its scale table to memory and read them back,
// which a long prompt repays and 9-16 rows do not (Gemma 3's 168 MB output
// matrix: 1.2-1.5x the prefill tiles at 9-16 rows, 2 threads; at 4-8 rows
// quant_avx512.cpp's register tiles are as fast and stay). The scales of a
// chunk of 8 blocks are formed before the chunk runs, one vector multiply per
// weight row and block (the rows' d_x in its lanes). Each pair's lanes are
// then taken apart and summed by hsum8, so every (weight row, activation row)
// gets the canonical order of quant.h, whatever the tile.
//
// vpdpbusd multiplies unsigned by signed bytes: the activation biased by 128
// is the unsigned side, the weight the signed one, and the accumulator starts
// at -128 * (the weight's 4-sums), which takes the bias back exactly in int32
// (as quant_rows_avx512.cpp does).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"
#include "kernels/quant/zmm_pairs_simd.h"

namespace ctx::qk {

namespace {

constexpr int kMinRows = 9;
constexpr int kMaxRows = 16;
constexpr int kLanes = 16;  // the rows' d_x in one zmm
constexpr int kChunk = 8;   // blocks whose scales are formed together

// The activation rows, prepared once per call.
struct XPair {
  __m512i v;  // rows 2p and 2p + 1 of a block, dwords interleaved
};
struct XRows {
  std::vector<XPair> q;    // [block][pair]
  std::vector<float> d;    // [block][kLanes]: d_x of each row (0 past the last row)
};
struct XView {
  const XPair* q;
  const float* d;
};

void prep(const BlockQ8A* X, int nb, int rows, XRows& xr) {
  const int np = (rows + 1) / 2;
  xr.q.resize(static_cast<size_t>(nb) * np);
  xr.d.assign(static_cast<size_t>(nb) * kLanes, 0.0f);
  const __m256i flip = _mm256_set1_epi8(-128);  // x + 128: the sign bit flipped
  auto bytes = [&](int r, int b) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(X[static_cast<size_t>(r) * nb + b].qs)),
                            flip);
  };
  for (int b = 0; b < nb; ++b) {
    for (int p = 0; p < np; ++p)  // a missing second row: zero bytes, scale 0, never stored
      xr.q[static_cast<size_t>(b) * np + p].v =
          interleave_dwords(bytes(2 * p, b), 2 * p + 1 < rows ? bytes(2 * p + 1, b) : _mm256_setzero_si256());
    for (int r = 0; r < rows; ++r) xr.d[static_cast<size_t>(b) * kLanes + r] = X[static_cast<size_t>(r) * nb + b].d;
  }
}

// A block's 32 signed weights with each dword doubled (dword 2l + h:
// elements 4l..4l+3), and start = -128 * their 4-sums.
inline __m512i unpack(const uint8_t* p, __m512i& start) {
  const __m512i q = doubled_dwords(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)));
  start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), q));
  return q;
}

// Weight rows [0, NK) from w0 (row_bytes apart) against the NP prepared pairs
// (nx rows).
template <int NK, int NP>
void tile(const uint8_t* w0, size_t row_bytes, int nb, int nx, XView xr, float* Y, size_t y_stride) {
  constexpr size_t bb = block_bytes_q(DType::Q8_0);
  __m512 acc[NK][NP];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  alignas(64) float sc[kChunk][NK][kLanes];
  for (int c = 0; c < nb; c += kChunk) {
    const int n = std::min(kChunk, nb - c);
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      const __m512 dx = _mm512_loadu_ps(xr.d + b * kLanes);
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        _mm512_store_ps(sc[i][k], _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(load_u16(p))), dx));
      }
    }
    for (int i = 0; i < n; ++i) {
      const size_t b = static_cast<size_t>(c + i);
      __m512i w[NK], start[NK];
      for (int k = 0; k < NK; ++k) {
        const uint8_t* p = w0 + k * row_bytes + b * bb;
        // The weights stream from memory once: ask for the next tile's bytes
        // at this offset while this one computes.
        _mm_prefetch(reinterpret_cast<const char*>(p + NK * row_bytes), _MM_HINT_T0);
        w[k] = unpack(p, start[k]);
      }
      const XPair* xq = xr.q + b * NP;
      for (int q = 0; q < NP; ++q)
        for (int k = 0; k < NK; ++k) {
          const __m512i isum = _mm512_dpbusd_epi32(start[k], xq[q].v, w[k]);
          // Rows 2q and 2q + 1's scales, alternating as the lanes do.
          const __m512 s2 =
              _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_load_sd(reinterpret_cast<const double*>(&sc[i][k][2 * q]))));
          acc[k][q] = _mm512_fmadd_ps(s2, _mm512_cvtepi32_ps(isum), acc[k][q]);
        }
    }
  }
  // Lanes 0..7: row 2q's canonical lanes, 8..15: row 2q + 1's.
  const __m512i apart = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int k = 0; k < NK; ++k) {
    for (int q = 0; q < NP; ++q) {
      const __m512 both = _mm512_permutexvar_ps(apart, acc[k][q]);
      for (int h = 0; h < 2 && 2 * q + h < nx; ++h) {
        const int r = 2 * q + h;
        Y[r * y_stride + k] = hsum8_ps(h == 0 ? _mm512_castps512_ps256(both) : _mm512_extractf32x8_ps(both, 1));
      }
    }
  }
}

// Weight rows [o0, o1) in tiles of 2 rows (5-8 pairs: at most 16
// accumulators), a last odd row alone.
template <int NP>
void rows(const uint8_t* w, size_t row_bytes, int nb, int nx, int o0, int o1, XView xr, float* Y, size_t y_stride) {
  int o = o0;
  for (; o + 2 <= o1; o += 2) tile<2, NP>(w + o * row_bytes, row_bytes, nb, nx, xr, Y + o, y_stride);
  if (o < o1) tile<1, NP>(w + o * row_bytes, row_bytes, nb, nx, xr, Y + o, y_stride);
}

template <int NP = (kMinRows + 1) / 2>
void rows_for(int np, const uint8_t* w, size_t row_bytes, int nb, int nx, int o0, int o1, XView xr, float* Y,
              size_t y_stride) {
  if constexpr (NP < kMaxRows / 2) {
    if (np != NP) return rows_for<NP + 1>(np, w, row_bytes, nb, nx, o0, o1, xr, Y, y_stride);
  }
  rows<NP>(w, row_bytes, nb, nx, o0, o1, xr, Y, y_stride);
}

}  // namespace

void matmul_q_rows_zmm_avx512(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                              size_t y_stride) {
  thread_local XRows xr;
  const int nb = n_in / QK;
  prep(Xq, nb, n_x, xr);
  rows_for((n_x + 1) / 2, static_cast<const uint8_t*>(W), nb * block_bytes_q(DType::Q8_0), nb, n_x, o0, o1,
           XView{xr.q.data(), xr.d.data()}, Y, y_stride);
}

}  // namespace ctx::qk
