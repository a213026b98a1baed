// Small helpers the quant *_avx2.cpp / *_avx512.cpp files share. Included
// only by those files; everything is static inline, so each ISA's
// translation unit keeps its own copy built with its own flags (an inline
// function with external linkage would be merged by the linker with one
// unit's flags: see quant_impl.h).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ctx::qk {

static inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

static inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// hsum8 (quant.h): lanes i + 4 (the high 128 bits), then i + 2 (movehl), then i + 1 (movehdup).
static inline float hsum8_ps(__m256 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// hsum8_ps of eight vectors at once, lane i of the result hsum8_ps of the
// i-th of (v0, v2, v4, v6, v1, v3, v5, v7): the same adds of the same
// operands, laid out across registers instead of within one, so bit for bit.
static inline __m256 hsum8x8_ps(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
                                __m256 v7) {
  // s4 (a[i] + a[i + 4]) of two vectors a register: [s4(v0) | s4(v1)], ...
  const __m256 p01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
  const __m256 p23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
  const __m256 p45 = _mm256_add_ps(_mm256_permute2f128_ps(v4, v5, 0x20), _mm256_permute2f128_ps(v4, v5, 0x31));
  const __m256 p67 = _mm256_add_ps(_mm256_permute2f128_ps(v6, v7, 0x20), _mm256_permute2f128_ps(v6, v7, 0x31));
  // s2 (s4[i] + s4[i + 2], i < 2): [s2(v0), s2(v2) | s2(v1), s2(v3)], [v4, v6 | v5, v7]
  const __m256 q0 = _mm256_add_ps(_mm256_shuffle_ps(p01, p23, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(p01, p23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 q1 = _mm256_add_ps(_mm256_shuffle_ps(p45, p67, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(p45, p67, _MM_SHUFFLE(3, 2, 3, 2)));
  // s2[0] + s2[1]
  return _mm256_add_ps(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The largest of 8 lanes (exact, in any order).
static inline float hmax8_ps(__m256 a) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

// The sum of 8 int32 lanes (exact).
static inline int hsum8_epi32(__m256i a) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1))));
}

// The 32 bits at p as 32 bytes, 0xFF where the bit is set: byte k is bit k
// (Q5_*'s bit 4 of element k).
static inline __m256i bytes_from_bits(const uint8_t* p) {
  // Byte k takes source byte k / 8, then every bit but k % 8 is forced on.
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(p))),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0x0000000000000000));
  const __m256i probe = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(probe, _mm256_set1_epi64x(-1));
}

// Batched decode's activation rows [0, n_x) against weight rows [o0, o1)
// (quant_rows_avx2.cpp, quant_rows_avx512.cpp): up to `most` rows (one
// tile's reach) as one group; more as two (17: 8 + 9), with the weight rows
// by bands of about 64 KB (whole tiles: multiples of 4 rows), each meeting
// both groups while it sits in L2, so the weights (the output matrices,
// streamed from memory) are still read once. prep(g, first, rows) readies
// group g, rows [first, first + rows); run(g, first, rows, b0, b1) multiplies
// it by weight rows [b0, b1).
template <typename Prep, typename Run>
static inline void by_row_groups(int n_x, int most, int o0, int o1, size_t row_bytes, Prep prep, Run run) {
  if (n_x <= most) {
    prep(0, 0, n_x);
    return run(0, 0, n_x, o0, o1);
  }
  const int half = n_x / 2;
  prep(0, 0, half);
  prep(1, half, n_x - half);
  constexpr size_t kBandBytes = 64 * 1024;
  const int band = std::max(4, static_cast<int>(kBandBytes / row_bytes) / 4 * 4);
  for (int b0 = o0; b0 < o1; b0 += band) {
    run(0, 0, half, b0, std::min(o1, b0 + band));
    run(1, half, n_x - half, b0, std::min(o1, b0 + band));
  }
}

}  // namespace ctx::qk
