// Q4_K matmul for 2 or more activation rows (prefill, batched decode) on
// AVX-512 VNNI, with the weight rows as lanes: a tile of 16 weight rows is
// unpacked once into a buffer laid out for vpdpbusd, then each activation row
// meets all 16 rows at once. The per-pair sums are then whole int32 lanes, so the canonical float
// steps of quant.h (one fma per 64 values, one per pair of mins) are done for
// 16 pairs by one vector instruction instead of after a horizontal sum each.
//
// Exactness: vpdpbusd adds four u8 x s8 products to an int32 without
// saturation; a sub-block's raw sum is at most 32 * 15 * 127 = 60960, times
// its 6-bit scale plus the other sub-block's stays below 2^23. The mins go
// through vpmaddwd: m <= 63 and |q8s| <= 32 * 127 fit int16, and the product
// pairs never reach the one case vpmaddwd saturates (both -32768).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

namespace {

constexpr int kRows = 16;  // weight rows per tile: one per int32 lane

// One super-block of a tile, lane j = weight row j of the tile.
struct alignas(64) TileBlock {
  __m512i q[8][8];  // sub-block s, group g: row j's nibbles 32s + 4g .. 32s + 4g + 3, one per byte
  __m512i sc[8];    // sub-block s's 6-bit scale
  __m512i mins[4];  // m[2k] | m[2k + 1] << 16, for vpmaddwd against the activation's q8s pair
  __m512 d, dmin;   // f16(d), f16(dmin)
};

inline __m512i bits(__m512i v, int shift, int mask) {
  return _mm512_and_si512(_mm512_srli_epi32(v, shift), _mm512_set1_epi32(mask));
}

// r[j] = 16 dwords of row j -> r[c] = dword c of rows 0..15: 32-bit, then
// 64-bit interleaves within 128-bit lanes, then a 4 x 4 transpose of lanes.
void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], lane L: dword 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// Unpacks super-block i of the tile's rows (row j at w + j * row_bytes);
// rows past n_rows repeat the last one (their lanes are never stored).
// Transposed with shuffles: a gather is several times slower.
void unpack_tile_block(const uint8_t* w, int row_bytes, int n_rows, int i, TileBlock& t) {
  const uint8_t* b = w + static_cast<size_t>(i) * sizeof(BlockQ4_K);
  for (int half = 0; half < 2; ++half) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j)
      r[j] = _mm512_loadu_si512(b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes + offsetof(BlockQ4_K, qs) + 64 * half);
    transpose16(r);
    // qs dword 8jj + g holds elements 64jj + 4g.. (low nibbles, sub-block 2jj) and 64jj + 32 + 4g.. (high, 2jj + 1).
    for (int d = 0; d < 16; ++d) {
      const int jj = 2 * half + d / 8, g = d % 8;
      t.q[2 * jj][g] = bits(r[d], 0, 0x0F0F0F0F);
      t.q[2 * jj + 1][g] = bits(r[d], 4, 0x0F0F0F0F);
    }
  }
  // The 16 header bytes (d, dmin, scales): lane L of h[q] is row q + 4L, then a 4 x 4 dword transpose in lanes.
  __m512i h[4];
  for (int q = 0; q < 4; ++q) {
    const auto row = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes)); };
    h[q] = _mm512_inserti32x4(_mm512_castsi128_si512(row(q)), row(q + 4), 1);
    h[q] = _mm512_inserti32x4(_mm512_inserti32x4(h[q], row(q + 8), 2), row(q + 12), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(h[0], h[1]), t1 = _mm512_unpackhi_epi32(h[0], h[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(h[2], h[3]), t3 = _mm512_unpackhi_epi32(h[2], h[3]);
  const auto dword = [&](int c) {
    return c == 0 ? _mm512_unpacklo_epi64(t0, t2) : c == 1 ? _mm512_unpackhi_epi64(t0, t2)
         : c == 2 ? _mm512_unpacklo_epi64(t1, t3) : _mm512_unpackhi_epi64(t1, t3);
  };
  // The 12 scale bytes as unpack_k4_scales reads them, on 16 rows at once.
  const __m512i u0 = dword(1), u1 = dword(2), u2 = dword(3);
  __m512i m[8];
  for (int j = 0; j < 4; ++j) {
    t.sc[j] = bits(u0, 8 * j, 63);
    m[j] = bits(u1, 8 * j, 63);
    t.sc[j + 4] = _mm512_or_si512(bits(u2, 8 * j, 0xF), _mm512_slli_epi32(bits(u0, 8 * j + 6, 3), 4));
    m[j + 4] = _mm512_or_si512(bits(u2, 8 * j + 4, 0xF), _mm512_slli_epi32(bits(u1, 8 * j + 6, 3), 4));
  }
  for (int k = 0; k < 4; ++k) t.mins[k] = _mm512_or_si512(m[2 * k], _mm512_slli_epi32(m[2 * k + 1], 16));
  const __m512i dd = dword(0);  // d | dmin << 16
  t.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
  t.dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
}

// The 4 activation bytes at p in every lane.
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// The tile's 16 rows against NX activation rows x (rows of nb blocks; q8s:
// their q8s pairs, 4 per block), in the canonical Q4_K order of quant.h.
template <int NX>
void tile_rows(const TileBlock* tb, int nb, const BlockQ8K* x, const int32_t* q8s, float* Y, size_t y_stride,
               __mmask16 store) {
  __m512 acc1[NX], accm[NX];
  for (int r = 0; r < NX; ++r) acc1[r] = accm[r] = _mm512_setzero_ps();
  for (int i = 0; i < nb; ++i) {
    const TileBlock& t = tb[i];
    for (int k = 0; k < 4; ++k) {
      __m512i isum[NX];
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * k + h;
        __m512i raw[NX];
        for (int r = 0; r < NX; ++r) raw[r] = _mm512_setzero_si512();
        for (int g = 0; g < 8; ++g) {
          const __m512i wq = t.q[s][g];
          for (int r = 0; r < NX; ++r)
            raw[r] = _mm512_dpbusd_epi32(raw[r], wq, bcast4(x[static_cast<size_t>(r) * nb + i].qs + 32 * s + 4 * g));
        }
        for (int r = 0; r < NX; ++r) {
          const __m512i scaled = _mm512_mullo_epi32(raw[r], t.sc[s]);
          isum[r] = h ? _mm512_add_epi32(isum[r], scaled) : scaled;
        }
      }
      for (int r = 0; r < NX; ++r) {
        const size_t ri = static_cast<size_t>(r) * nb + i;
        const __m512 yd = _mm512_set1_ps(x[ri].d);
        acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(t.d, yd), acc1[r]);
        const __m512i mk = _mm512_madd_epi16(t.mins[k], _mm512_set1_epi32(q8s[4 * ri + k]));
        accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mk), _mm512_mul_ps(t.dmin, yd), accm[r]);
      }
    }
  }
  for (int r = 0; r < NX; ++r) _mm512_mask_storeu_ps(Y + r * y_stride, store, _mm512_sub_ps(acc1[r], accm[r]));
}

constexpr int kNX = 6;  // activation rows per pass over a tile's buffer

using TileRowsFn = void (*)(const TileBlock*, int, const BlockQ8K*, const int32_t*, float*, size_t, __mmask16);

template <int... NX>
TileRowsFn tile_rows_for(int nx, std::integer_sequence<int, NX...>) {
  static constexpr TileRowsFn fns[] = {tile_rows<NX + 1>...};
  return fns[nx - 1];
}

}  // namespace

void matmul_q4k_tiles_avx512(const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                             size_t y_stride) {
  const int nb = n_in / QK_K;
  const int row_bytes = nb * static_cast<int>(sizeof(BlockQ4_K));
  const auto* wbase = static_cast<const uint8_t*>(W);
  thread_local std::vector<int32_t> q8s;
  q8s.resize(static_cast<size_t>(n_x) * nb * 4);
  q8s_pairs(Xk, static_cast<size_t>(n_x) * nb, q8s.data());
  thread_local std::vector<TileBlock> tile;
  tile.resize(nb);
  constexpr auto seq = std::make_integer_sequence<int, kNX>{};
  for (int o = o0; o < o1; o += kRows) {
    const int n_rows = std::min(kRows, o1 - o);
    for (int i = 0; i < nb; ++i) unpack_tile_block(wbase + static_cast<size_t>(o) * row_bytes, row_bytes, n_rows, i, tile[i]);
    const auto store = static_cast<__mmask16>((1u << n_rows) - 1);
    for (int r = 0; r < n_x; r += kNX) {
      const int nx = std::min(kNX, n_x - r);
      tile_rows_for(nx, seq)(tile.data(), nb, Xk + static_cast<size_t>(r) * nb, q8s.data() + static_cast<size_t>(r) * nb * 4,
                             Y + r * y_stride + o, y_stride, store);
    }
  }
}

}  // namespace ctx::qk
