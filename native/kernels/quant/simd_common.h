// Small helpers the quant *_avx2.cpp / *_avx512.cpp files share. Included
// only by those files; everything is static inline, so each ISA's
// translation unit keeps its own copy built with its own flags (an inline
// function with external linkage would be merged by the linker with one
// unit's flags: see quant_impl.h).
#pragma once

#include <immintrin.h>

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

}  // namespace ctx::qk
