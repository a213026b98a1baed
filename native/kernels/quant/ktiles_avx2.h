// Q4_K and Q6_K tiles (ktiles_simd.h) on AVX2: 8 weight rows a ymm, written once for
// two builds: ktiles_avx2.cpp (AVX2 alone) and ktiles_avxvnni.cpp (with
// AVX-VNNI's 256-bit vpdpbusd, where the CPU has it: kernels/quant/quant_impl.h
// avx2_vnni). Both give the sub-block sums times their scales as the same
// int32s, so the same bits.
//
// Exactness without VNNI: vpmaddubsw gives int16 sums of two u8 x s8 products, at most
// 2 * 15 * 127 = 3810 in size (|y| <= 127), so a sub-block's 8 of them add
// up (vpaddw) to at most 30480 < 32767 per int16; vpmaddwd against the scale
// in both halves of the lane then gives sc * (the 32-value sum) as int32.
// With VNNI: vpdpbusd adds the products straight into int32 (at most
// 32 * 15 * 127 = 60960), and vpmulld by the scale gives the same int32.
// The mins are as on AVX-512 (vpmaddwd, no saturation).
//
// Q6_K without VNNI: two groups of 4 values (q <= 63, |y| <= 127) add up to at
// most 4 * 63 * 127 = 32004 per int16, so a sub-block takes two vpmaddwd
// against its scale; the offset of 32 is taken once a super-block, 32 * (sum
// of sc[s] * bsums[s]) by vpmaddwd of scale pairs against bsum pairs
// (|bsums| <= 16 * 127). With VNNI the raw sums are int32 and start at -32 *
// the bsum, as on AVX-512 (ktiles_avx512.cpp).
#pragma once

#include "kernels/quant/ktiles_simd.h"
#include "kernels/simd_f32.h"

namespace ctx::qk {

namespace {

// One super-block of a tile, lane j = weight row j of the tile.
struct alignas(32) TileBlock256 {
  __m256i q[8][8];  // sub-block s, group g: row j's nibbles 32s + 4g .. 32s + 4g + 3, one per byte
  __m256i sc[8];    // sub-block s's 6-bit scale: in both int16 halves (vpmaddwd), or as int32 (VNNI's vpmulld)
  __m256i mins[4];  // m[2k] | m[2k + 1] << 16, for vpmaddwd against the activation's q8s pair
  __m256 d, dmin;   // f16(d), f16(dmin)
};

inline __m256i bits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi32(v, shift), _mm256_set1_epi32(mask));
}

// 8 f16 values, the low halves of v's dwords, as floats.
inline __m256 halves_to_ps(__m256i v) {
  const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
}

// The 16 bytes at `offset` in each of the tile's rows (row j at b + j *
// row_bytes; past n_rows the last) as 4 dwords: lane j of out[c] is row j's
// dword c. Loaded so that lane L of h[q] is row q + 4L's, then a 4 x 4 dword
// transpose in lanes.
__attribute__((always_inline)) inline void row_dwords4(const uint8_t* b, int row_bytes, int n_rows, size_t offset,
                                                       __m256i out[4]) {
  const auto row = [&](int j) {
    return reinterpret_cast<const __m128i*>(b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes + offset);
  };
  __m256i h[4];
  for (int q = 0; q < 4; ++q) h[q] = _mm256_loadu2_m128i(row(q + 4), row(q));
  const __m256i t0 = _mm256_unpacklo_epi32(h[0], h[1]), t1 = _mm256_unpackhi_epi32(h[0], h[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(h[2], h[3]), t3 = _mm256_unpackhi_epi32(h[2], h[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// Unpacks super-block i of the tile's rows (row j at w + j * row_bytes);
// rows past n_rows repeat the last one (their lanes are never stored).
template <bool kVnni>
void unpack_tile_block(const uint8_t* w, int row_bytes, int n_rows, int i, TileBlock256& t) {
  const uint8_t* b = w + static_cast<size_t>(i) * sizeof(BlockQ4_K);
  const auto row = [&](int j) { return b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes; };
  for (int quarter = 0; quarter < 4; ++quarter) {
    __m256i r[8];
    for (int j = 0; j < 8; ++j)
      r[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row(j) + offsetof(BlockQ4_K, qs) + 32 * quarter));
    transpose8(r);
    // qs dword g of chunk jj holds elements 64jj + 4g.. (low nibbles, sub-block 2jj) and 64jj + 32 + 4g.. (high, 2jj + 1).
    for (int g = 0; g < 8; ++g) {
      t.q[2 * quarter][g] = bits(r[g], 0, 0x0F0F0F0F);
      t.q[2 * quarter + 1][g] = bits(r[g], 4, 0x0F0F0F0F);
    }
  }
  // The 16 header bytes (d, dmin, scales) of each row.
  __m256i dw[4];
  row_dwords4(b, row_bytes, n_rows, 0, dw);
  const __m256i dd = dw[0];  // d | dmin << 16
  const __m256i u0 = dw[1], u1 = dw[2], u2 = dw[3];
  // The 12 scale bytes as unpack_k4_scales reads them, on 8 rows at once.
  __m256i sc[8], m[8];
  for (int j = 0; j < 4; ++j) {
    sc[j] = bits(u0, 8 * j, 63);
    m[j] = bits(u1, 8 * j, 63);
    sc[j + 4] = _mm256_or_si256(bits(u2, 8 * j, 0xF), _mm256_slli_epi32(bits(u0, 8 * j + 6, 3), 4));
    m[j + 4] = _mm256_or_si256(bits(u2, 8 * j + 4, 0xF), _mm256_slli_epi32(bits(u1, 8 * j + 6, 3), 4));
  }
  for (int s = 0; s < 8; ++s) t.sc[s] = kVnni ? sc[s] : _mm256_or_si256(sc[s], _mm256_slli_epi32(sc[s], 16));
  for (int k = 0; k < 4; ++k) t.mins[k] = _mm256_or_si256(m[2 * k], _mm256_slli_epi32(m[2 * k + 1], 16));
  t.d = halves_to_ps(dd);
  t.dmin = halves_to_ps(_mm256_srli_epi32(dd, 16));
}

// One Q6_K super-block of a tile, lane j = weight row j of the tile.
struct alignas(32) Q6Block256 {
  __m256i q[16][4];  // sub-block s, group g: row j's q (0..63) of elements 16s + 4g .. 16s + 4g + 3
  __m256i sc[16];    // sub-block s's int8 scale: in both int16 halves (vpmaddwd), or as int32 (VNNI's vpmulld)
  __m256i scp[8];    // without VNNI: sc[2m] | sc[2m + 1] << 16 (int16 halves), against the bsum pairs
  __m256 d;          // f16(d)
};

// Unpacks Q6_K super-block i of the tile's rows (the layout as in ktiles_avx512.cpp).
template <bool kVnni>
void unpack_q6_block(const uint8_t* w, int row_bytes, int n_rows, int i, Q6Block256& t) {
  const uint8_t* b = w + static_cast<size_t>(i) * sizeof(BlockQ6_K);
  const auto row = [&](int j) { return b + static_cast<size_t>(std::min(j, n_rows - 1)) * row_bytes; };
  const auto rows32 = [&](size_t offset, __m256i r[8]) {
    for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row(j) + offset));
    transpose8(r);
  };
  for (int h = 0; h < 2; ++h) {
    __m256i qh[8];  // qh dword 8h + m
    rows32(offsetof(BlockQ6_K, qh) + 32 * h, qh);
    for (int odd = 0; odd < 2; ++odd) {
      __m256i ql[8];  // ql dword 16h + 8 * odd + m
      rows32(offsetof(BlockQ6_K, ql) + 64 * h + 32 * odd, ql);
      for (int c = odd; c < 4; c += 2)
        for (int m = 0; m < 8; ++m) {
          const __m256i hi = _mm256_slli_epi32(bits(qh[m], 2 * c, 0x03030303), 4);
          t.q[8 * h + 2 * c + m / 4][m % 4] = _mm256_or_si256(bits(ql[m], 4 * (c / 2), 0x0F0F0F0F), hi);
        }
    }
  }
  __m256i dw[4];  // the 16 scale bytes of each row
  row_dwords4(b, row_bytes, n_rows, offsetof(BlockQ6_K, scales), dw);
  __m256i sc[16];
  for (int s = 0; s < 16; ++s) sc[s] = _mm256_srai_epi32(_mm256_slli_epi32(dw[s / 4], 24 - 8 * (s % 4)), 24);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (int s = 0; s < 16; ++s)
    t.sc[s] = kVnni ? sc[s] : _mm256_or_si256(_mm256_and_si256(sc[s], low16), _mm256_slli_epi32(sc[s], 16));
  for (int m = 0; m < 8; ++m)
    t.scp[m] = _mm256_or_si256(_mm256_and_si256(sc[2 * m], low16), _mm256_slli_epi32(sc[2 * m + 1], 16));
  alignas(16) uint16_t d[8];
  for (int j = 0; j < 8; ++j) std::memcpy(&d[j], row(j) + offsetof(BlockQ6_K, d), sizeof(uint16_t));
  t.d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
}

template <bool kVnni>
struct Avx2 {
  static constexpr int kRows = 8;  // weight rows per tile: one per int32 lane
  static constexpr int kNX = 2;    // activation rows per pass (measured fastest; 16 ymm registers)
  using F = __m256;
  using I = __m256i;
  using Raw = __m256i;  // vpmaddubsw's int16 pair sums, added up by vpaddw; with VNNI, vpdpbusd's int32 sums
  using Mask = __m256i;
  using TileBlock = TileBlock256;
  using Q6Block = Q6Block256;
  static constexpr auto unpack = unpack_tile_block<kVnni>;
  static constexpr auto unpack_q6 = unpack_q6_block<kVnni>;
  static constexpr int kQ6Groups = kVnni ? 4 : 2;  // int16 raw sums hold two groups of a Q6_K sub-block
  static constexpr bool kQ6Start = kVnni;          // int32 ones start at -32 * the bsum
  static F zero() { return _mm256_setzero_ps(); }
  static Raw zero_raw() { return _mm256_setzero_si256(); }
  static Raw dot4(Raw raw, I wq, const int8_t* x) {
    if constexpr (kVnni) return _mm256_dpbusd_avx_epi32(raw, wq, _mm256_set1_epi32(load4(x)));
    else return _mm256_add_epi16(raw, _mm256_maddubs_epi16(wq, _mm256_set1_epi32(load4(x))));
  }
  static I scaled(Raw raw, I sc) {
    if constexpr (kVnni) return _mm256_mullo_epi32(raw, sc);
    else return _mm256_madd_epi16(raw, sc);
  }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub_i(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I shl5(I a) { return _mm256_slli_epi32(a, 5); }
  static Raw start(int32_t v) { return _mm256_set1_epi32(v); }
  static I mins(I m, int32_t pair) { return _mm256_madd_epi16(m, _mm256_set1_epi32(pair)); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static Mask rows(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static void store(float* p, Mask m, F v) { _mm256_maskstore_ps(p, m, v); }
};

}  // namespace

}  // namespace ctx::qk
