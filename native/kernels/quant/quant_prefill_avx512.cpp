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
//
// Where the CPU's 512-bit units are whole (Intel; AMD from Zen 5), a second
// path, Avx512Zmm, holds two pairs in each zmm: (weight row k, activation rows
// j and j + 1), their dwords interleaved (lane 2l + h is pair h's canonical
// lane l), the weight's dwords doubled to match, and both pairs' scales come
// in one 64-bit broadcast. Each lane gets exactly the operations it gets in a
// ymm, so the bits are the same; the step retires at nearly the ymm rate with
// twice the MACs. On Zen 4, which splits zmm operations in two, it is slower,
// so prefill_tiles() picks per CPU (quant_impl.h).
#include "kernels/quant/quant_prefill_simd.h"
#include "kernels/quant/simd_common.h"
#include "kernels/quant/zmm_pairs_simd.h"

namespace ctx::qk {

namespace {

struct Avx512 : F32x16 {
  static constexpr int kGroup = kLanes;  // activation rows per scale vector
  static constexpr int kNK = 4;          // weight rows per tile
  static constexpr int kNX = 4;          // activation rows per tile (sub-tiles of a group)
  static constexpr int kAhead = 2;       // tiles whose rows are prefetched ahead
  static constexpr int kScaleGroups = 1;  // activation groups a scale table pass makes
  template <DType T>
  static constexpr int x_parts() { return 1; }
  static constexpr int kXRows = 1;       // activation rows an XBlock holds
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

struct Avx512Zmm : F32x16 {
  static constexpr int kGroup = kLanes;  // activation rows per scale vector
  static constexpr int kNK = 4;          // weight rows per tile
  static constexpr int kNX = 8;          // activation rows per tile (4 pairs of rows)
  static constexpr int kAhead = 2;       // tiles whose rows are prefetched ahead
  static constexpr int kScaleGroups = 1;  // activation groups a scale table pass makes
  template <DType T>
  static constexpr int x_parts() { return 1; }
  static constexpr int kXRows = 2;       // activation rows an XBlock holds
  struct XBlock { __m512i v; };          // two rows' blocks, dwords interleaved
  struct WBlock { __m512i v; };          // an unpacked weight block (or start), dwords doubled
  template <DType T>
  static void prep_x(const BlockQ8A* X, int nb, int rows, Scratch<Avx512Zmm>& s);
  template <DType T>
  static void unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx512Zmm>& s);
  template <DType T, int NK, int NX>
  static void tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y,
                   size_t y_stride);
};

// One activation block as vpdpbusd takes it: x + 128 (x with its sign bit
// flipped) where the activation is the unsigned side, x itself where it is not.
template <DType T>
__m256i x_bytes(const BlockQ8A& xb) {
  const __m256i flip = _mm256_set1_epi8(has_min(T) ? 0 : -128);
  return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs)), flip);
}

// The 32 weight values of the block at p as bytes: Q4_1 / Q5_1's q (0..31),
// the signed types' values (q - 8, q - 16, q).
template <DType T>
__m256i weight_bytes(const uint8_t* p) {
  constexpr bool q5 = T == DType::Q5_0 || T == DType::Q5_1;
  constexpr size_t qs_offset = (has_min(T) ? 4 : 2) + (q5 ? 4 : 0);
  if constexpr (T == DType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  } else {
    // Elements 0..15 are the low nibbles, 16..31 the high ones; Q5_*:
    // bit e of qh is bit 4 of element e.
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_offset));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
    if constexpr (q5) v = _mm256_mask_add_epi8(v, load_u32(p + qs_offset - 4), v, _mm256_set1_epi8(16));
    if constexpr (T == DType::Q4_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    if constexpr (T == DType::Q5_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
    return v;
  }
}

// A signed type's vpdpbusd start: -128 * (the 4-sums of the weight values v).
__m256i bias_start(__m256i v) {
  return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), v));
}

// Weight rows [0, nk) from w (row_bytes apart) into the tile buffers s.wq /
// s.wd / s.wm (kNK rows; the scales of a short tile's missing rows are made
// from stale values and never read). put(i, v) stores block i's bytes v at
// wq[i] and, where the weight is the signed side, its start at wq[kNK * nb + i];
// none where the weight is the unsigned side (the start is 0).
template <DType T, typename V, typename Put>
void unpack_tile(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<V>& s, Put put) {
  constexpr size_t bb = block_bytes_q(T);
  for (int o = 0; o < nk; ++o) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = w + o * row_bytes + b * bb;
      const size_t i = static_cast<size_t>(o) * nb + b;
      const __m256i v = weight_bytes<T>(p);
      put(i, v);
      if constexpr (!has_min(T)) put(static_cast<size_t>(V::kNK) * nb + i, bias_start(v));
      s.wd[i] = _cvtsh_ss(load_u16(p));
      if (has_min(T)) s.wm[i] = _cvtsh_ss(load_u16(p + 2));
    }
  }
}

// One activation row's results for the tile's NK weight rows: their hsum8s
// (lane k: weight row k), plus Q4_1 / Q5_1's min sums (summ[k * kGroup]).
template <DType T, int NK>
void store_row(__m128 dot, const float* summ, float* y) {
  if constexpr (has_min(T)) {
    alignas(16) float m[4] = {};
    for (int k = 0; k < NK; ++k) m[k] = summ[k * F32x16::kLanes];
    dot = _mm_add_ps(dot, _mm_load_ps(m));
  }
  if constexpr (NK == 4) {
    _mm_storeu_ps(y, dot);
  } else {
    _mm_mask_storeu_ps(y, static_cast<__mmask8>((1u << NK) - 1), dot);
  }
}

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
  prep_groups<T>(X, nb, rows, s, [&](XBlock* out, const BlockQ8A* first, int g_rows) {
    for (int j = 0; j < g_rows; ++j) out[j].v = x_bytes<T>(first[static_cast<size_t>(j) * nb]);
  });
}

template <DType T>
void Avx512::unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx512>& s) {
  unpack_tile<T>(w, row_bytes, nk, nb, s, [&](size_t i, __m256i v) { s.wq[i].v = v; });
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
    store_row<T, NK>(hsum8x4(a), summ + j, Y + j * y_stride);
  }
}

// Activation rows X[0, rows) into groups of kGroup rows, by pairs of rows
// (a missing second row: zero bytes, its scale 0; never stored).
template <DType T>
void Avx512Zmm::prep_x(const BlockQ8A* X, int nb, int rows, Scratch<Avx512Zmm>& s) {
  prep_groups<T>(X, nb, rows, s, [&](XBlock* out, const BlockQ8A* first, int g_rows) {
    for (int j = 0; j < g_rows; j += 2) {
      const BlockQ8A* x0 = &first[static_cast<size_t>(j) * nb];
      out[j / 2].v = interleave_dwords(x_bytes<T>(*x0), j + 1 < g_rows ? x_bytes<T>(x0[nb]) : _mm256_setzero_si256());
    }
  });
}

template <DType T>
void Avx512Zmm::unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch<Avx512Zmm>& s) {
  unpack_tile<T>(w, row_bytes, nk, nb, s, [&](size_t i, __m256i v) { s.wq[i].v = doubled_dwords(v); });
}

// hsum8 of both pairs of four interleaved accumulators: lane k of the low
// half is pair 0's hsum8(a[k]), of the high half pair 1's. hsum8's steps on
// interleaved lanes: lanes m + 8 (the 256-bit halves), m + 4, m + 2.
__m256 hsum8x4_pairs(const __m512* a) {
  __m256 s4[4];
  for (int k = 0; k < 4; ++k) s4[k] = _mm256_add_ps(_mm512_castps512_ps256(a[k]), _mm512_extractf32x8_ps(a[k], 1));
  const __m512 z01 = _mm512_insertf32x8(_mm512_castps256_ps512(s4[0]), s4[1], 1);
  const __m512 z23 = _mm512_insertf32x8(_mm512_castps256_ps512(s4[2]), s4[3], 1);
  const __m512 lo = _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(2, 0, 2, 0));  // lanes m < 4 of a[k] in 128-bit lane k
  const __m512 hi = _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(3, 1, 3, 1));  // lanes 4..7
  const __m512 s2 = _mm512_add_ps(lo, hi);
  const __m512 s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_castps512_ps256(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), s1));
}

// One tile: NK weight rows x NX activation rows ((NX + 1) / 2 pairs of rows;
// x: pair p of the group's block b at x[b * kGroup / 2 + p]); sc and summ as
// Avx512::tile's. Where NX is odd the last pair's second row is computed and
// not stored.
template <DType T, int NK, int NX>
void Avx512Zmm::tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y,
                     size_t y_stride) {
  constexpr int NP = (NX + 1) / 2;
  __m512 acc[NK][NP];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m512i w[NK], start[NK];
    for (int k = 0; k < NK; ++k) {
      w[k] = wq[k * nb + b].v;
      start[k] = has_min(T) ? _mm512_setzero_si512() : wq[(kNK + k) * nb + b].v;
    }
    const XBlock* xb = x + b * (kGroup / 2);
    const float* scb = sc + b * kNK * kGroup;
    for (int p = 0; p < NP; ++p) {
      const __m512i q = xb[p].v;
      for (int k = 0; k < NK; ++k) {
        const __m512i dot = has_min(T) ? _mm512_dpbusd_epi32(start[k], w[k], q) : _mm512_dpbusd_epi32(start[k], q, w[k]);
        // Rows 2p and 2p + 1's scales, alternating as the lanes do.
        const __m512 s2 = _mm512_castpd_ps(
            _mm512_broadcastsd_pd(_mm_load_sd(reinterpret_cast<const double*>(scb + k * kGroup + 2 * p))));
        acc[k][p] = _mm512_fmadd_ps(s2, _mm512_cvtepi32_ps(dot), acc[k][p]);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    __m512 a[kNK] = {};
    for (int k = 0; k < NK; ++k) a[k] = acc[k][p];
    const __m256 both = hsum8x4_pairs(a);
    for (int h = 0; h < 2 && 2 * p + h < NX; ++h) {
      const int j = 2 * p + h;
      store_row<T, NK>(h == 0 ? _mm256_castps256_ps128(both) : _mm256_extractf128_ps(both, 1), summ + j,
                       Y + j * y_stride);
    }
  }
}

}  // namespace

void matmul_q_prefill_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                             size_t y_stride, uint64_t x_id) {
  if (prefill_tiles() == PrefillTiles::zmm)
    return matmul_q_prefill_simd<Avx512Zmm>(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  matmul_q_prefill_simd<Avx512>(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
}

}  // namespace ctx::qk
