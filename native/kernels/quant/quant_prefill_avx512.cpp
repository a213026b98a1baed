// AVX-512 prefill (n_x >= 16; quant_prefill_simd.h): groups of 16 activation
// rows, tiles of 4 weight rows. A pair's isum is one 256-bit vpdpbusd (lane
// l: elements 4l..4l+3, exactly canonical lane l). The scale is a scalar per pair, so it comes as a
// broadcast memory operand of the fma: the inner loop is vpdpbusd, cvt and
// fma per 32 MACs, nothing else. (The decode kernel's zmm holds two pairs
// whose scales differ per half; it needs a vector multiply per pair and block.)
//
// vpdpbusd multiplies unsigned by signed bytes. Q4_1 / Q5_1: the weight q
// (0..31) is the unsigned side, the activation the signed one. Q4_0, Q5_0,
// Q8_0, whose weights are signed: the activation biased by 128 (x + 128,
// 1..255) is the unsigned side, the weight value (q - 8, q - 16, q) the signed
// one, and the accumulator starts at -128 * (the weight's 4-sums), which takes
// the bias back exactly in int32. The bias sits on the weight side so that an
// activation block is 32 bytes (the activation rows stream past each tile of
// weights; a tile's weights stay in L1).
#include "kernels/quant/quant_prefill_simd.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

struct Avx512 : F32x16 {
  static constexpr int kGroup = kLanes;  // activation rows per scale vector
  static constexpr int kNK = 4;          // weight rows per tile
  static constexpr int kNX = 4;          // activation rows per tile (sub-tiles of a group)
  static constexpr int kAhead = 2;       // tiles whose rows are prefetched ahead
  struct XBlock { __m256i v; };              // one prepared activation block
  struct WBlock { __m256i v; };            // one unpacked weight block, or (signed types) its vpdpbusd start
  template <DType T>
  static void prep_x(const BlockQ8A* X, int nb, int rows, Scratch<Avx512>& s);
  template <DType T>
  static void unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx512>& s);
  template <DType T, int NK, int NX>
  static void tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y,
                   size_t y_stride);
};

// hsum8 of four accumulators at once: lane k is hsum8(a[k]), by hsum8's own
// steps on each: the 128-bit halves (lanes i + 4), then lanes i + 2, then i + 1.
__m128 hsum8x4(const __m256* a) {
  const __m512 z01 = _mm512_insertf32x8(_mm512_castps256_ps512(a[0]), a[1], 1);
  const __m512 z23 = _mm512_insertf32x8(_mm512_castps256_ps512(a[2]), a[3], 1);
  const __m512 lo = _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(2, 0, 2, 0));  // a[k] lanes 0-3 in 128-bit lane k
  const __m512 hi = _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(3, 1, 3, 1));  // a[k] lanes 4-7
  const __m512 s4 = _mm512_add_ps(lo, hi);
  const __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, _MM_SHUFFLE(1, 1, 1, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s1));
}

// Activation rows X[0, rows) (nb blocks each) into groups of kGroup rows.
template <DType T>
void Avx512::prep_x(const BlockQ8A* X, int nb, int rows, Scratch<Avx512>& s) {
  const int ng = (rows + kGroup - 1) / kGroup;
  if (s.x.size() < static_cast<size_t>(ng) * nb * kGroup) s.x.resize(static_cast<size_t>(ng) * nb * kGroup);
  if (s.xd.size() < static_cast<size_t>(ng) * nb) {
    s.xd.resize(static_cast<size_t>(ng) * nb);
    s.xs.resize(static_cast<size_t>(ng) * nb);
  }
  // Biased activations: x + 128 is x with its sign bit flipped.
  const __m256i flip = _mm256_set1_epi8(has_min(T) ? 0 : -128);
  for (int g = 0; g < ng; ++g) {
    const int g_rows = std::min(kGroup, rows - g * kGroup);
    for (int b = 0; b < nb; ++b) {
      alignas(64) float d[kGroup] = {}, sx[kGroup] = {};
      XBlock* out = &s.x[(static_cast<size_t>(g) * nb + b) * kGroup];
      for (int j = 0; j < g_rows; ++j) {
        const BlockQ8A& xb = X[static_cast<size_t>(g * kGroup + j) * nb + b];
        out[j].v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs)), flip);
        d[j] = xb.d;
        sx[j] = xb.s;
      }
      s.xd[static_cast<size_t>(g) * nb + b].v = _mm512_load_ps(d);
      if (has_min(T)) s.xs[static_cast<size_t>(g) * nb + b].v = _mm512_load_ps(sx);
    }
  }
}

// Weight rows [0, nk) from w (row_bytes apart) into the tile buffers s.wq /
// s.wd / s.wm (kNK rows; the scales of a short tile's missing rows are made
// from stale values and never read).
template <DType T>
void Avx512::unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx512>& s) {
  constexpr size_t bb = block_bytes_q(T);
  constexpr bool q5 = T == DType::Q5_0 || T == DType::Q5_1;
  constexpr size_t qs_offset = (has_min(T) ? 4 : 2) + (q5 ? 4 : 0);
  for (int o = 0; o < nk; ++o) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = w + o * row_bytes + b * bb;
      const size_t i = static_cast<size_t>(o) * nb + b;
      __m256i v;
      if constexpr (T == DType::Q8_0) {
        v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      } else {
        // Elements 0..15 are the low nibbles, 16..31 the high ones; Q5_*:
        // bit e of qh is bit 4 of element e.
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_offset));
        v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
        if constexpr (q5) v = _mm256_mask_add_epi8(v, load_u32(p + qs_offset - 4), v, _mm256_set1_epi8(16));
        if constexpr (T == DType::Q4_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
        if constexpr (T == DType::Q5_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
      }
      s.wq[i].v = v;
      // -128 * (4-sums of the weight values), after the tile's blocks; none
      // where the weight is the unsigned side (the start is 0).
      if constexpr (!has_min(T))
        s.wq[static_cast<size_t>(kNK) * nb + i].v = _mm256_sub_epi32(
            _mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), v));
      s.wd[i] = _cvtsh_ss(load_u16(p));
      if (has_min(T)) s.wm[i] = _cvtsh_ss(load_u16(p + 2));
    }
  }
}

// One tile: NK weight rows (wq, nb blocks a row) x NX activation rows (x:
// row j of the group's block b at x[b * kGroup + j]); sc and summ are the
// tile's scale table and min sums as floats, offset to the tile's first row.
template <DType T, int NK, int NX>
void Avx512::tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y, size_t y_stride) {
  __m256 acc[NK][NX];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m256i w[NK], start[NK];
    for (int k = 0; k < NK; ++k) {
      w[k] = wq[k * nb + b].v;
      start[k] = has_min(T) ? _mm256_setzero_si256() : wq[(kNK + k) * nb + b].v;
    }
    const XBlock* xb = x + b * kGroup;
    const float* scb = sc + b * kNK * kGroup;
    for (int j = 0; j < NX; ++j) {
      const __m256i q = xb[j].v;
      for (int k = 0; k < NK; ++k) {
        const __m256i dot = has_min(T) ? _mm256_dpbusd_epi32(start[k], w[k], q) : _mm256_dpbusd_epi32(start[k], q, w[k]);
        acc[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(scb[k * kGroup + j]), _mm256_cvtepi32_ps(dot), acc[k][j]);
      }
    }
  }
  for (int j = 0; j < NX; ++j) {
    __m256 a[kNK] = {};
    for (int k = 0; k < NK; ++k) a[k] = acc[k][j];
    __m128 dot = hsum8x4(a);
    if constexpr (has_min(T)) {
      alignas(16) float m[kNK] = {};
      for (int k = 0; k < NK; ++k) m[k] = summ[k * kGroup + j];
      dot = _mm_add_ps(dot, _mm_load_ps(m));
    }
    if constexpr (NK == kNK) {
      _mm_storeu_ps(Y + j * y_stride, dot);
    } else {
      _mm_mask_storeu_ps(Y + j * y_stride, static_cast<__mmask8>((1u << NK) - 1), dot);
    }
  }
}

}  // namespace

void matmul_q_prefill_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                             size_t y_stride) {
  matmul_q_prefill_simd<Avx512>(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride);
}

}  // namespace ctx::qk
