// AVX2 prefill (quant_prefill_simd.h): groups of 8 activation rows, tiles of
// 2 weight rows, AVX2's integer dot product, written once for two builds:
// quant_prefill_avx2.cpp (AVX2 alone) and quant_prefill_avxvnni.cpp (AVX2
// with AVX-VNNI, the 256-bit vpdpbusd of Intel's cores since Alder Lake and
// its AVX2-only Xeons). The int32 4-sums come from vpdpbusd where there is
// VNNI (one instruction, its start the bias term), else from vpmaddubsw
// (u8 x s8 -> int16 pairs) and vpmaddwd with ones; the same exact integers
// either way (no int16 saturation for these operands):
//   Q4_1, Q5_1: q (0..31) x x (|x| <= 127): 2 * 31 * 127 = 7874;
//   Q4_0, Q5_0: the same with q, then the bias taken back in int32 by adding
//     nbias = -bias * (x's 4-sums), prepared with the activations;
//   Q8_0: the sign trick, |w| x (x with w's sign): 2 * 128 * 127 = 32512.
#pragma once

#include "kernels/quant/quant_prefill_simd.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

// weight_bias (quant_impl.h) where the weight is vpmaddubsw's unsigned side: not Q8_0's.
constexpr int avx2_bias(DType t) { return t == DType::Q8_0 ? 0 : weight_bias(t); }

template <bool kVnni>
struct Avx2 : F32x8 {
  static constexpr int kGroup = kLanes;  // activation rows per scale vector
  static constexpr int kNK = 2;          // weight rows per tile (16 ymm registers)
  static constexpr int kNX = 4;          // activation rows per tile (sub-tiles of a group)
  static constexpr int kAhead = 0;
  static constexpr int kScaleGroups = 4;  // activation groups a scale table pass makes (8 fma chains)
  static constexpr int kXRows = 1;       // activation rows an XBlock holds
  // A group's prepared block: its rows' quants, then (Q4_0, Q5_0) their bias
  // terms nbias = -bias * (x's 4-sums), an XBlock each.
  struct XBlock { __m256i v; };
  template <DType T>
  static constexpr int x_parts() { return avx2_bias(T) != 0 ? 2 : 1; }
  struct WBlock { __m256i v; };  // the unsigned operand; Q8_0's second one: the signed weights
  template <DType T>
  static void prep_x(const BlockQ8A* X, int nb, int rows, Scratch<Avx2<kVnni>>& s);
  template <DType T>
  static void unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx2<kVnni>>& s);
  template <DType T, int NK, int NX>
  static void tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y,
                   size_t y_stride);
};

// The 32 bits at p as 32 bytes, 0x10 where the bit is set (Q5_*'s bit 4).
__m256i high_bits(const uint8_t* p) { return _mm256_and_si256(bytes_from_bits(p), _mm256_set1_epi8(0x10)); }

template <bool kVnni>
template <DType T>
void Avx2<kVnni>::prep_x(const BlockQ8A* X, int nb, int rows, Scratch<Avx2<kVnni>>& s) {
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(avx2_bias(T)));
  prep_groups<T>(X, nb, rows, s, [&](XBlock* out, const BlockQ8A* first, int g_rows) {
    for (int j = 0; j < g_rows; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first[static_cast<size_t>(j) * nb].qs));
      out[j].v = q;
      if (avx2_bias(T) != 0) {
        const __m256i sum4 = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, q), _mm256_set1_epi16(1));
        out[kGroup + j].v = _mm256_sub_epi32(_mm256_setzero_si256(), sum4);
      }
    }
  });
}

// Weight rows [0, nk) from w (row_bytes apart) into the tile buffers (kNK
// rows; a short tile's missing rows keep stale values, never read).
template <bool kVnni>
template <DType T>
void Avx2<kVnni>::unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx2<kVnni>>& s) {
  constexpr size_t bb = block_bytes_q(T);
  constexpr bool q5 = T == DType::Q5_0 || T == DType::Q5_1;
  constexpr size_t qs_offset = (has_min(T) ? 4 : 2) + (q5 ? 4 : 0);
  for (int o = 0; o < nk; ++o) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = w + o * row_bytes + b * bb;
      const size_t i = static_cast<size_t>(o) * nb + b;
      if constexpr (T == DType::Q8_0) {
        const __m256i sign = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
        s.wq[i].v = _mm256_abs_epi8(sign);
        s.wq[static_cast<size_t>(kNK) * nb + i].v = sign;
      } else {
        // Elements 0..15 are the low nibbles, 16..31 the high ones.
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_offset));
        __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
        if constexpr (q5) u = _mm256_or_si256(u, high_bits(p + qs_offset - 4));
        s.wq[i].v = u;
      }
      s.wd[i] = _cvtsh_ss(load_u16(p));
      if (has_min(T)) s.wm[i] = _cvtsh_ss(load_u16(p + 2));
    }
  }
}

// One tile: NK weight rows x NX activation rows (x: row j of the group's
// block b at x[b * kGroup + j]); sc and summ offset to the tile's first row.
template <bool kVnni>
template <DType T, int NK, int NX>
void Avx2<kVnni>::tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y, size_t y_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NK][NX];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const XBlock* xb = x + b * kGroup * x_parts<T>();
    const float* scb = sc + b * kNK * kGroup;
    for (int k = 0; k < NK; ++k) {
      const __m256i u = wq[k * nb + b].v;
      const __m256i sign = T == DType::Q8_0 ? wq[(kNK + k) * nb + b].v : u;
      for (int j = 0; j < NX; ++j) {
        const __m256i q = T == DType::Q8_0 ? _mm256_sign_epi8(xb[j].v, sign) : xb[j].v;
        __m256i dot;
        if constexpr (kVnni) {
          dot = _mm256_dpbusd_avx_epi32(avx2_bias(T) != 0 ? xb[kGroup + j].v : _mm256_setzero_si256(), u, q);
        } else {
          dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), ones);
          if (avx2_bias(T) != 0) dot = _mm256_add_epi32(dot, xb[kGroup + j].v);
        }
        acc[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(scb[k * kGroup + j]), _mm256_cvtepi32_ps(dot), acc[k][j]);
      }
    }
  }
  if constexpr (NK == 2 && NX == 4) {
    // The eight sums at once: lanes 0-3 rows (0, j), lanes 4-7 rows (1, j).
    __m256 dot = hsum8x8_ps(acc[0][0], acc[1][0], acc[0][1], acc[1][1], acc[0][2], acc[1][2], acc[0][3], acc[1][3]);
    if (has_min(T)) dot = _mm256_add_ps(dot, _mm256_loadu2_m128(summ + kGroup, summ));
    const __m128 k0 = _mm256_castps256_ps128(dot), k1 = _mm256_extractf128_ps(dot, 1);
    const __m128 j01 = _mm_unpacklo_ps(k0, k1), j23 = _mm_unpackhi_ps(k0, k1);  // (row 0, row 1) of j, j + 1
    _mm_storel_pi(reinterpret_cast<__m64*>(Y), j01);
    _mm_storeh_pi(reinterpret_cast<__m64*>(Y + y_stride), j01);
    _mm_storel_pi(reinterpret_cast<__m64*>(Y + 2 * y_stride), j23);
    _mm_storeh_pi(reinterpret_cast<__m64*>(Y + 3 * y_stride), j23);
  } else {
    for (int k = 0; k < NK; ++k)
      for (int j = 0; j < NX; ++j) {
        float dot = hsum8_ps(acc[k][j]);
        if (has_min(T)) dot = dot + summ[k * kGroup + j];
        Y[j * y_stride + k] = dot;
      }
  }
}

}  // namespace

}  // namespace ctx::qk
