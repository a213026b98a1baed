// The K-quant matmul on 256-bit vectors, included by kquant_avx2.cpp
// (KQ_VNNI 0) and kquant_avx512.cpp (KQ_VNNI 1: vpdpwssd folds the scale
// multiply and the add, and 32 registers hold wider tiles). Everything is in
// an anonymous namespace: each ISA's translation unit keeps its own copy (see
// quant_impl.h on why inline functions must not be shared across ISA flags).
//
// Canonical lanes (quant.h): int32 lane l of a 32-byte chunk holds elements
// 4l..4l+3 of it, and every chunk starts at a multiple of 32 elements, so
// summing the chunks' lanes gives exactly isum[l]; integer sums are exact in
// any order. vpmaddubsw (u8 x s8 -> saturating int16 pair sums) never
// saturates here: unsigned weights are at most 63 (2 * 63 * 127 < 32767);
// signed ones (Q3_K, Q8_K) go in as |q| with the sign moved onto y, |q| <= 128
// and |y| <= 127 (quantize_row_q8k never makes -128): 2 * 128 * 127 = 32512.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

#ifndef KQ_VNNI
#error "define KQ_VNNI before including kquant_simd.h"
#endif

namespace ctx::qk {

namespace {

template <DType T>
constexpr bool kSigned = T == DType::Q3_K || T == DType::Q8_K;

// One weight super-block, unpacked for vpmaddubsw.
struct SuperBlock {
  __m256i q[8];    // chunk c: elements 32c..32c+31 (signed types: |q|)
  __m256i sgn[8];  // signed types: q itself, whose signs go onto y
  __m256i sc[8];   // int16 lane k of chunk c: the scale of elements 32c + 2k and 32c + 2k + 1
  __m256i sc16;    // Q6_K: the 16 scales, Q2_K: the 16 mins (int16)
  __m128i mins8;   // Q4_K, Q5_K: the 8 mins (int16)
  float d, dmin;
};

// Chunk c's scale vector from the 16 scales as int16: scale 2c in the low
// 8 lanes (elements 32c..32c+15), 2c + 1 in the high 8.
inline __m256i scale_pair(__m256i sc16, int c) {
  const __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(c));  // (s[2c], s[2c+1]) in every dword
  return _mm256_shuffle_epi8(pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                    2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m256i bits_at(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}
inline float f16(uint16_t h) { return _cvtsh_ss(h); }

template <DType T>
void unpack_sb(const uint8_t* p, SuperBlock& s) {
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    using B = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
    const auto& b = *reinterpret_cast<const B*>(p);
    // The 12 scale bytes as 8 scales then 8 mins, 6 bits each (unpack_k4_scales, on words).
    uint32_t u[3];
    std::memcpy(u, b.scales, sizeof(u));
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const __m256i sm = _mm256_cvtepu8_epi16(_mm_setr_epi32(
        static_cast<int>(u[0] & low6), static_cast<int>((u[2] & low4) | (((u[0] >> 6) & low2) << 4)),
        static_cast<int>(u[1] & low6), static_cast<int>(((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4))));
    const __m128i sc8 = _mm256_castsi256_si128(sm);
    const __m256i sc2 = _mm256_setr_m128i(sc8, sc8);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(b.qs + 32 * j);
      s.q[2 * j] = bits_at(bits, 0, 0xF);
      s.q[2 * j + 1] = bits_at(bits, 4, 0xF);
    }
    if constexpr (T == DType::Q5_K) {
      const __m256i hb = load256(b.qh);
      for (int c = 0; c < 8; ++c) s.q[c] = _mm256_or_si256(s.q[c], _mm256_slli_epi16(bits_at(hb, c, 1), 4));
    }
    // Chunk c is sub-block c: int16 c in every lane.
    for (int c = 0; c < 8; ++c) s.sc[c] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16(static_cast<short>((2 * c + 1) << 8 | 2 * c)));
    s.mins8 = _mm256_extracti128_si256(sm, 1);
    s.d = f16(b.d);
    s.dmin = f16(b.dmin);
  } else if constexpr (T == DType::Q6_K) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(p);
    for (int h = 0; h < 2; ++h) {
      const __m256i a = load256(b.ql + 64 * h), c = load256(b.ql + 64 * h + 32), hb = load256(b.qh + 32 * h);
      s.q[4 * h + 0] = _mm256_or_si256(bits_at(a, 0, 0xF), _mm256_slli_epi16(bits_at(hb, 0, 3), 4));
      s.q[4 * h + 1] = _mm256_or_si256(bits_at(c, 0, 0xF), _mm256_slli_epi16(bits_at(hb, 2, 3), 4));
      s.q[4 * h + 2] = _mm256_or_si256(bits_at(a, 4, 0xF), _mm256_slli_epi16(bits_at(hb, 4, 3), 4));
      s.q[4 * h + 3] = _mm256_or_si256(bits_at(c, 4, 0xF), _mm256_slli_epi16(bits_at(hb, 6, 3), 4));
    }
    s.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    for (int c = 0; c < 8; ++c) s.sc[c] = scale_pair(s.sc16, c);
    s.d = f16(b.d);
    s.dmin = 0.0f;
  } else if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
    using B = std::conditional_t<T == DType::Q2_K, BlockQ2_K, BlockQ3_K>;
    const auto& b = *reinterpret_cast<const B*>(p);
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load256(b.qs + 32 * h);
      for (int k = 0; k < 4; ++k) s.q[4 * h + k] = bits_at(bits, 2 * k, 3);
    }
    if constexpr (T == DType::Q2_K) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
      for (int c = 0; c < 8; ++c) s.sc[c] = scale_pair(sc16, c);
      s.sc16 = _mm256_cvtepu8_epi16(_mm_srli_epi16(_mm_and_si128(packed, _mm_set1_epi8(static_cast<char>(0xF0))), 4));
      s.d = f16(b.d);
      s.dmin = f16(b.dmin);
    } else {
      // q = low + 4 * high - 4: -4 where the hmask bit is clear.
      const __m256i hb = load256(b.hmask);
      for (int c = 0; c < 8; ++c) {
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(s.q[c], _mm256_slli_epi16(bits_at(hb, c, 1), 2)), _mm256_set1_epi8(4));
        s.sgn[c] = q;
        s.q[c] = _mm256_abs_epi8(q);
      }
      alignas(16) uint8_t sc[16];
      unpack_q3k_scales(b.scales, sc);
      const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sc))),
                                            _mm256_set1_epi16(32));
      for (int c = 0; c < 8; ++c) s.sc[c] = scale_pair(sc16, c);
      s.d = f16(b.d);
      s.dmin = 0.0f;
    }
  } else {  // Q8_K
    const auto& b = *reinterpret_cast<const BlockQ8K*>(p);
    for (int c = 0; c < 8; ++c) {
      s.sgn[c] = load256(b.qs + 32 * c);
      s.q[c] = _mm256_abs_epi8(s.sgn[c]);
      s.sc[c] = _mm256_set1_epi16(1);
    }
    s.d = b.d;
    s.dmin = 0.0f;
  }
}

// sumi + (int32 pair sums of p * sc)
inline __m256i madd_add(__m256i sumi, __m256i p, __m256i sc) {
#if KQ_VNNI
  return _mm256_dpwssd_epi32(sumi, p, sc);
#else
  return _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
#endif
}

// One (weight row, activation row) pair's accumulators.
struct PairAcc {
  __m256 acc;
  float acc1;   // Q4_K: the super-block sums
  float summ;   // Q5_K; Q4_K: the mins
};

inline int hsum_i32_4(__m128i a) {
  const __m128i s = _mm_add_epi32(a, _mm_unpackhi_epi64(a, a));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

// The exact int32 lanes isum (before corr) of one super-block of one pair,
// 32 bytes at a time.
template <DType T>
inline __m256i pair_ints(const SuperBlock& s, const BlockQ8K& y) {
  __m256i sumi = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    const __m256i yq = load256(y.qs + 32 * c);
    const __m256i p = kSigned<T> ? _mm256_maddubs_epi16(s.q[c], _mm256_sign_epi8(yq, s.sgn[c])) : _mm256_maddubs_epi16(s.q[c], yq);
    sumi = madd_add(sumi, p, s.sc[c]);
  }
  return sumi;
}

#if KQ_VNNI
// The same lanes 64 bytes at a time, for a super-block unpacked in memory
// (chunks 2k and 2k + 1 side by side): int32 lane l + 8 of a zmm belongs to
// canonical lane l, folded exactly at the end.
template <DType T>
inline __m256i pair_ints_wide(const SuperBlock& s, const BlockQ8K& y) {
  __m512i sumi = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    __m512i yq = _mm512_loadu_si512(y.qs + 64 * k);
    if constexpr (kSigned<T>) {  // AVX-512 has no vpsignb: negate y where q < 0 (|q| is 0 where q is)
      const __mmask64 neg = _mm512_movepi8_mask(_mm512_loadu_si512(&s.sgn[2 * k]));
      yq = _mm512_mask_sub_epi8(yq, neg, _mm512_setzero_si512(), yq);
    }
    const __m512i p = _mm512_maddubs_epi16(_mm512_loadu_si512(&s.q[2 * k]), yq);
    sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_loadu_si512(&s.sc[2 * k]));
  }
  return _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
}
#endif

// Q4_K in llama.cpp's x86 order (its weights are repacked there: ggml_gemm_q4_K_8x8_q8_K):
// an exact sum per 64 values (two sub-blocks) and per pair of mins, each added in float.
inline void pair_step_q4k(const SuperBlock& s, const BlockQ8K& y, PairAcc& a) {
  const __m256i bsums = load256(y.bsums);
  alignas(16) int32_t mk[4];
  const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
  _mm_store_si128(reinterpret_cast<__m128i*>(mk), _mm_madd_epi16(s.mins8, q8s));
  const float d = s.d * y.d, dmin = s.dmin * y.d;
  for (int k = 0; k < 4; ++k) {
    __m256i pair = _mm256_setzero_si256();
    for (int c = 2 * k; c < 2 * k + 2; ++c)
      pair = madd_add(pair, _mm256_maddubs_epi16(s.q[c], load256(y.qs + 32 * c)), s.sc[c]);
    const int isum = hsum_i32_4(_mm_add_epi32(_mm256_castsi256_si128(pair), _mm256_extracti128_si256(pair, 1)));
    a.acc1 = std::fma(static_cast<float>(isum), d, a.acc1);
    a.summ = std::fma(static_cast<float>(mk[k]), dmin, a.summ);
  }
}

// One super-block of one pair, in the canonical order of quant.h.
template <DType T, bool kWide>
inline void pair_step(const SuperBlock& s, const BlockQ8K& y, PairAcc& a) {
  if constexpr (T == DType::Q4_K) return pair_step_q4k(s, y, a);
#if KQ_VNNI
  __m256i sumi = kWide ? pair_ints_wide<T>(s, y) : pair_ints<T>(s, y);
#else
  __m256i sumi = pair_ints<T>(s, y);
#endif
  const __m256i bsums = load256(y.bsums);
  if constexpr (T == DType::Q6_K) {  // llama.cpp's x86 tiled gemm: one exact sum a super-block (quant.h)
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, s.sc16), 5));
    const int isum = hsum_i32_4(_mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1)));
    a.acc1 = std::fma(static_cast<float>(isum) * s.d, y.d, a.acc1);
    return;
  }
  const float d = y.d * s.d;
  const float dmin = -(y.d * s.dmin);
  if constexpr (T == DType::Q2_K)
    a.acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(s.sc16, bsums)), a.acc);
  a.acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), a.acc);
  if constexpr (T == DType::Q5_K) {
    const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    a.summ = std::fma(dmin, static_cast<float>(hsum_i32_4(_mm_madd_epi16(s.mins8, q8s))), a.summ);
  }
}

template <DType T>
inline float pair_result(const PairAcc& a) {
  if constexpr (T == DType::Q4_K) return a.acc1 - a.summ;
  if constexpr (T == DType::Q6_K) return a.acc1;
  float dot = hsum8_ps(a.acc);
  if constexpr (T == DType::Q5_K) dot = dot + a.summ;
  return dot;
}

constexpr int kMaxNX = KQ_VNNI ? 6 : 4;  // activation rows per tile
#ifndef KQ_WIDE_LOCAL
#define KQ_WIDE_LOCAL 1
#endif
constexpr bool kWideLocal = KQ_VNNI && KQ_WIDE_LOCAL;

// One weight row against NX activation rows (x0: NX rows of nb blocks). The
// super-blocks come from `pre` (unpacked once for many tiles) or are
// unpacked here when pre is null.
template <DType T, int NX>
void tile_k(const uint8_t* w, size_t bb, const SuperBlock* pre, int nb, const BlockQ8K* x0, float* Y, size_t y_stride,
            size_t prefetch_ahead) {
  PairAcc a[NX];
  for (auto& p : a) p = PairAcc{_mm256_setzero_ps(), 0.0f, 0.0f};
  SuperBlock local;
  for (int i = 0; i < nb; ++i) {
    const SuperBlock* s = pre ? pre + i : &local;
    if (!pre) {
      // Decode streams the weights from memory: ask for the rows ahead.
      for (size_t off = 0; off < bb; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + i * bb + prefetch_ahead + off), _MM_HINT_T0);
      unpack_sb<T>(w + i * bb, local);
    }
    if ((kWideLocal && NX >= 3) || pre) {
      for (int j = 0; j < NX; ++j) pair_step<T, true>(*s, x0[static_cast<size_t>(j) * nb + i], a[j]);
    } else {
      for (int j = 0; j < NX; ++j) pair_step<T, false>(*s, x0[static_cast<size_t>(j) * nb + i], a[j]);
    }
  }
  for (int j = 0; j < NX; ++j) Y[j * y_stride] = pair_result<T>(a[j]);
}

using TileKFn = void (*)(const uint8_t*, size_t, const SuperBlock*, int, const BlockQ8K*, float*, size_t, size_t);

template <DType T, int... NX>
constexpr TileKFn tile_for(int nx, std::integer_sequence<int, NX...>) {
  TileKFn fns[] = {tile_k<T, NX + 1>...};
  return fns[nx - 1];
}

template <DType T>
void matmul_k_impl(const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y, size_t y_stride) {
  const int nb = n_in / QK_K;
  const size_t bb = dtype_row_bytes(T, QK_K), row_bytes = nb * bb;
  const auto* wbase = static_cast<const uint8_t*>(W);
  constexpr auto seq = std::make_integer_sequence<int, kMaxNX>{};
  if (n_x <= kMaxNX) {
    // Few activation rows: unpack each super-block as it streams by.
    const TileKFn fn = tile_for<T>(n_x, seq);
    for (int o = o0; o < o1; ++o) fn(wbase + o * row_bytes, bb, nullptr, nb, Xk, Y + o, y_stride, 2 * row_bytes);
    return;
  }
  // Many: unpack a weight row once, then meet every activation row with it.
  thread_local std::vector<SuperBlock> pre;
  pre.resize(nb);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* w = wbase + o * row_bytes;
    for (int i = 0; i < nb; ++i) unpack_sb<T>(w + i * bb, pre[i]);
    for (int r = 0; r < n_x; r += kMaxNX) {
      const int nx = std::min(kMaxNX, n_x - r);
      tile_for<T>(nx, seq)(w, bb, pre.data(), nb, Xk + static_cast<size_t>(r) * nb, Y + r * y_stride + o, y_stride, 0);
    }
  }
}

void matmul_k_dispatch(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                       size_t y_stride) {
  switch (t) {
    case DType::Q2_K: return matmul_k_impl<DType::Q2_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
    case DType::Q3_K: return matmul_k_impl<DType::Q3_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
    case DType::Q4_K: return matmul_k_impl<DType::Q4_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
    case DType::Q5_K: return matmul_k_impl<DType::Q5_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
    case DType::Q6_K: return matmul_k_impl<DType::Q6_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
    default: return matmul_k_impl<DType::Q8_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
  }
}

}  // namespace

}  // namespace ctx::qk
