// Two (weight row, activation row) pairs in one zmm, as the AVX-512 files that
// hold them lay them out (quant_prefill_avx512.cpp's zmm tiles,
// quant_rows_zmm_avx512.cpp): lane 2l + h is pair h's canonical lane l
// (elements 4l..4l+3 of a block). Included only by those *_avx512.cpp files;
// everything is in an anonymous namespace, so each keeps its own copy.
#pragma once

#include <immintrin.h>

namespace ctx::qk {

namespace {

// Activation rows a and b of one block as one zmm: [a | b] with their dwords interleaved.
inline __m512i interleave_dwords(__m256i a, __m256i b) {
  const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), ab);
}

// A weight block's 8 dwords, each doubled to meet both rows of a pair: dword 2l + h = dword l.
inline __m512i doubled_dwords(__m256i v) {
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                  _mm512_castsi256_si512(v));
}

}  // namespace

}  // namespace ctx::qk
