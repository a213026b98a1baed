// Q4_K and Q6_K tiles (ktiles_simd.h) on AVX-512 VNNI: 16 weight rows a zmm,
// unpacked into a buffer laid out for vpdpbusd.
//
// Exactness: vpdpbusd adds four u8 x s8 products to an int32 without
// saturation; a sub-block's raw sum is at most 32 * 15 * 127 = 60960, times
// its 6-bit scale plus the other sub-block's stays below 2^23. The mins go
// through vpmaddwd: m <= 63 and |q8s| <= 32 * 127 fit int16, and the product
// pairs never reach the one case vpmaddwd saturates (both -32768). Q6_K: a
// sub-block's raw sum starts at -32 * its bsum (|.| <= 16 * 32 * 127) and adds
// 16 products of q <= 63 and |y| <= 127, so it is sum (q - 32) * y, at most
// 65024 in size; times the int8 scale and over 16 sub-blocks, below 2^28.
#include "kernels/quant/ktiles_simd.h"

namespace ctx::qk {

namespace {

// One super-block of a tile, lane j = weight row j of the tile.
struct alignas(64) TileBlock512 {
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
// (Always inlined, as row_dwords4: called out of line, the registers go through memory, and
// Q4_K's unpacking for 2 activation rows measured 20% slower.)
__attribute__((always_inline)) inline void transpose16(__m512i r[16]) {
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

// The 16 bytes at `offset` in each of the tile's rows (row j at b + j *
// row_bytes; past n_rows the last) as 4 dwords: lane j of out[c] is row j's
// dword c. Loaded so that lane L of h[q] is row q + 4L's, then a 4 x 4 dword
// transpose in lanes.
__attribute__((always_inline)) inline void row_dwords4(const uint8_t* b, int row_bytes, int n_rows, size_t offset,
                                                       __m512i out[4]) {
  const auto row = [&](int j) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes + offset));
  };
  __m512i h[4];
  for (int q = 0; q < 4; ++q) {
    h[q] = _mm512_inserti32x4(_mm512_castsi128_si512(row(q)), row(q + 4), 1);
    h[q] = _mm512_inserti32x4(_mm512_inserti32x4(h[q], row(q + 8), 2), row(q + 12), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(h[0], h[1]), t1 = _mm512_unpackhi_epi32(h[0], h[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(h[2], h[3]), t3 = _mm512_unpackhi_epi32(h[2], h[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Unpacks super-block i of the tile's rows (row j at w + j * row_bytes);
// rows past n_rows repeat the last one (their lanes are never stored).
// Transposed with shuffles: a gather is several times slower.
void unpack_tile_block(const uint8_t* w, int row_bytes, int n_rows, int i, TileBlock512& t) {
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
  // The 16 header bytes (d, dmin, scales) of each row.
  __m512i dword[4];
  row_dwords4(b, row_bytes, n_rows, 0, dword);
  // The 12 scale bytes as unpack_k4_scales reads them, on 16 rows at once.
  const __m512i u0 = dword[1], u1 = dword[2], u2 = dword[3];
  __m512i m[8];
  for (int j = 0; j < 4; ++j) {
    t.sc[j] = bits(u0, 8 * j, 63);
    m[j] = bits(u1, 8 * j, 63);
    t.sc[j + 4] = _mm512_or_si512(bits(u2, 8 * j, 0xF), _mm512_slli_epi32(bits(u0, 8 * j + 6, 3), 4));
    m[j + 4] = _mm512_or_si512(bits(u2, 8 * j + 4, 0xF), _mm512_slli_epi32(bits(u1, 8 * j + 6, 3), 4));
  }
  for (int k = 0; k < 4; ++k) t.mins[k] = _mm512_or_si512(m[2 * k], _mm512_slli_epi32(m[2 * k + 1], 16));
  const __m512i dd = dword[0];  // d | dmin << 16
  t.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
  t.dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
}

// One Q6_K super-block of a tile, lane j = weight row j of the tile.
struct alignas(64) Q6Block512 {
  __m512i q[16][4];  // sub-block s, group g: row j's q (0..63) of elements 16s + 4g .. 16s + 4g + 3
  __m512i sc[16];    // sub-block s's int8 scale, as int32
  __m512 d;          // f16(d)
};

// Unpacks Q6_K super-block i of the tile's rows as unpack_tile_block does Q4_K's.
// Element 128h + 32c + 4m (c < 4, m < 8) takes the low (c < 2) or high nibble
// of ql dword 16h + 8(c % 2) + m and bits 2c, 2c + 1 of qh dword 8h + m.
void unpack_q6_block(const uint8_t* w, int row_bytes, int n_rows, int i, Q6Block512& t) {
  const uint8_t* b = w + static_cast<size_t>(i) * sizeof(BlockQ6_K);
  const auto row = [&](int j) { return b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes; };
  __m512i qh[16];
  for (int j = 0; j < 16; ++j) qh[j] = _mm512_loadu_si512(row(j) + offsetof(BlockQ6_K, qh));
  transpose16(qh);
  for (int h = 0; h < 2; ++h) {
    __m512i ql[16];
    for (int j = 0; j < 16; ++j) ql[j] = _mm512_loadu_si512(row(j) + offsetof(BlockQ6_K, ql) + 64 * h);
    transpose16(ql);
    for (int c = 0; c < 4; ++c)
      for (int m = 0; m < 8; ++m) {
        const __m512i hi = _mm512_slli_epi32(bits(qh[8 * h + m], 2 * c, 0x03030303), 4);
        t.q[8 * h + 2 * c + m / 4][m % 4] = _mm512_or_si512(bits(ql[8 * (c % 2) + m], 4 * (c / 2), 0x0F0F0F0F), hi);
      }
  }
  __m512i dw[4];  // the 16 scale bytes of each row
  row_dwords4(b, row_bytes, n_rows, offsetof(BlockQ6_K, scales), dw);
  for (int s = 0; s < 16; ++s) t.sc[s] = _mm512_srai_epi32(_mm512_slli_epi32(dw[s / 4], 24 - 8 * (s % 4)), 24);
  alignas(32) uint16_t d[16];
  for (int j = 0; j < 16; ++j) std::memcpy(&d[j], row(j) + offsetof(BlockQ6_K, d), sizeof(uint16_t));
  t.d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d)));
}

struct Avx512 {
  static constexpr int kRows = 16;  // weight rows per tile: one per int32 lane
  static constexpr int kNX = 6;     // activation rows per pass over a tile's buffer
  using F = __m512;
  using I = __m512i;
  using Raw = __m512i;  // vpdpbusd's int32 sums
  using Mask = __mmask16;
  using TileBlock = TileBlock512;
  using Q6Block = Q6Block512;
  static constexpr auto unpack = unpack_tile_block;
  static constexpr auto unpack_q6 = unpack_q6_block;
  static constexpr int kQ6Groups = 4;      // a Q6_K sub-block's raw sum in int32 (vpdpbusd)
  static constexpr bool kQ6Start = true;   // ... starting at -32 * its bsum
  static F zero() { return _mm512_setzero_ps(); }
  static Raw zero_raw() { return _mm512_setzero_si512(); }
  static Raw dot4(Raw raw, I wq, const int8_t* x) { return _mm512_dpbusd_epi32(raw, wq, _mm512_set1_epi32(load4(x))); }
  static I scaled(Raw raw, I sc) { return _mm512_mullo_epi32(raw, sc); }
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  static Raw start(int32_t v) { return _mm512_set1_epi32(v); }
  static I mins(I m, int32_t pair) { return _mm512_madd_epi16(m, _mm512_set1_epi32(pair)); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static Mask rows(int n) { return static_cast<Mask>((1u << n) - 1); }
  static void store(float* p, Mask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
};

}  // namespace

void matmul_ktiles_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                          size_t y_stride) {
  matmul_ktiles<Avx512>(t, W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace ctx::qk
