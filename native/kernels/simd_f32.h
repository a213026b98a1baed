// Float vectors of both widths, for the kernels' width-templated bodies
// (attention/attention_simd.h, activations/activations_simd.h,
// lora/lora_kernels_simd.h): F32x8 (AVX2, ymm)
// and F32x16 (AVX-512, zmm) give the same names, so one body written over a
// path V compiles to either. A partial vector covers the first `Mask` lanes:
// AVX-512 masks them; AVX2 has no masked float loads of every kind, so it
// goes through a zero-padded copy (the lanes past the mask are zero either way).
// With F32x8 comes transpose8, an 8 x 8 transpose of 32-bit lanes.
//
// Included only by *_avx2.cpp / *_avx512.cpp files: everything is in an
// anonymous namespace, so each ISA's translation unit keeps its own copy
// built with its own flags (see quant/quant_impl.h), and F32x16 exists only
// where AVX-512 is enabled.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace ctx {

namespace {

#if defined(__AVX2__) && defined(__FMA__)
struct F32x8 {
  static constexpr int kLanes = 8;
  using F = __m256;
  using Mask = int;  // lanes from the first
  static Mask first(int lanes) { return lanes < 0 ? 0 : lanes; }
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F zero_past(Mask lanes, F v) {  // lanes past the mask set to zero
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
                                                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
  }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const float* p, Mask lanes) {
    if (lanes >= 8) return loadu(p);
    alignas(32) float tmp[8] = {};
    std::memcpy(tmp, p, sizeof(float) * lanes);
    return _mm256_load_ps(tmp);
  }
  static void storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, Mask lanes, F v) {
    if (lanes >= 8) return storeu(p, v);
    alignas(32) float out[8];
    _mm256_store_ps(out, v);
    std::memcpy(p, out, sizeof(float) * lanes);
  }
  // f16 and int8 values widened to floats.
  static F load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F load_f16(const uint16_t* p, Mask lanes) {
    if (lanes >= 8) return load_f16(p);
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, p, sizeof(uint16_t) * lanes);
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
  }
  // bf16 bits: the high half of an f32, so widening is exact.
  static F load_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static F load_bf16(const uint16_t* p, Mask lanes) {
    if (lanes >= 8) return load_bf16(p);
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, p, sizeof(uint16_t) * lanes);
    return load_bf16(tmp);
  }
  static F load_i8(const int8_t* p, Mask lanes) {
    int64_t raw = 0;
    std::memcpy(&raw, p, lanes >= 8 ? 8 : lanes);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(raw)));
  }
  static F load_i8(const int8_t* p) { return load_i8(p, 8); }
};

// r[j] = 8 dwords of row j -> r[c] = dword c of rows 0..7: an 8 x 8 transpose
// of 32-bit lanes, ints or floats' bits (ktiles_avx2.h's weight rows,
// activations_simd.h's RMS norm rows). Always inlined: out of line the
// registers go through memory (see ktiles_avx512.cpp).
__attribute__((always_inline)) inline void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], lane L: dword 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}
__attribute__((always_inline)) inline void transpose8(__m256 c[8]) {
  __m256i r[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_castps_si256(c[j]);
  transpose8(r);
  for (int j = 0; j < 8; ++j) c[j] = _mm256_castsi256_ps(r[j]);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
struct F32x16 {
  static constexpr int kLanes = 16;
  using F = __m512;
  using Mask = __mmask16;
  static Mask first(int lanes) { return lanes >= 16 ? static_cast<Mask>(0xFFFF) : static_cast<Mask>((1u << lanes) - 1); }
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F zero_past(Mask m, F v) { return _mm512_maskz_mov_ps(m, v); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, Mask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
  static F load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F load_f16(const uint16_t* p, Mask m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
  static F load_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static F load_bf16(const uint16_t* p, Mask m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
  static F load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F load_i8(const int8_t* p, Mask m) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p))); }
};
#endif

}  // namespace

}  // namespace ctx
