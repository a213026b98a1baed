// AVX-512 (VNNI) kernels.
//
// Integer types. The canonical order of quant.h has 8 lanes, so one zmm holds
// TWO independent 8-lane accumulators, one per 256-bit half, each for its own
// (weight row, activation row) pair:
//   decode (n_x == 1): halves = (row o, x) and (row o + 1, x): the two weight
//     rows' blocks b side by side, the activation block broadcast to both;
//   prefill: halves = (row o, x row r) and (row o, x row r + 1): the weight
//     block broadcast to both halves, two activation rows' blocks side by side.
// Per block, one 64-byte vpdpbusd gives both halves' int32 4-sums: lane l of
// a half sums elements 4l..4l+3 of its block, exactly canonical lane l. Each
// half gets the fma by its own pair's scale f16(d_w) * d_x, and at the end is
// folded with hsum8 on its own. A missing pair (odd row count) is computed on
// a copy and thrown away.
//
// vpdpbusd multiplies UNSIGNED by signed bytes, so the signed weights are
// biased to unsigned (Q4_0: q, whose value is q - 8; Q5_0: q, value q - 16;
// Q8_0: q + 128) and the
// bias is taken back exactly in int32 by starting the accumulator at
// -bias * sum(x) over the 4 bytes. The per-lane int32 is then the exact
// canonical isum, whatever the trick.
//
// (From 16 activation rows on, prefill goes to quant_prefill_avx512.cpp
// instead; below that this file's prefill tiles are faster, except for Q4_1
// and Q8_0 with 2 to 15 rows, which quant_rows_avx512.cpp takes, as it takes
// Q4_1's 16 and Q8_0's 16 to 32 on Zen 4: matmul_q_avx512 below.)
//
// Tiling: the weight side of a block is unpacked once into registers and used
// for every activation pair of the tile; the activation side is prepared once
// per batch of rows (prep_x) into vectors that the kernel reads as memory
// operands. Every (o, r) pair still has its own lanes fed in canonical order,
// so tiling never changes a result.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/prefetch.h"
#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr int kTile = 4;  // max weight rows and activation rows per tile (prefill)

// ---------------------------------------------------------------------------
// Integer matmul

// The activation side of one block for the two halves, ready for vpdpbusd.
struct XPair {
  __m512i q;      // the low half's 32 int8, then the high half's
  __m512i nbias;  // -bias * (sum of each 4 bytes), the int32 accumulator start (Q4_0, Q8_0)
  __m512 d;       // d_x of the low half's block in lanes 0-7, of the high half's in lanes 8-15
};

// Q4_1's per-block activation sums, laid out like the summ vector:
// prefill: lane i * 4 + j holds s_x of row j of the group (for every weight row i);
// decode: every lane holds s_x.
struct SVec {
  __m512 s;
};

constexpr size_t block_bytes(DType t) { return block_bytes_q(t); }

// Prefill: activation rows per group and pairs of them. Without a min term
// a group is 8 rows, so each unpacked weight block meets 4 pairs; Q4_1 and
// Q5_1 keep 4 (their summ vector holds 4 weight rows x 4 activation rows).
template <DType T>
constexpr int kXTile = has_min(T) ? 4 : 8;
template <DType T>
constexpr int kPairs = kXTile<T> / 2;
constexpr int kDecodeSlots = 4;    // decode: weight row pairs per tile (8 rows)

struct XScratch {
  std::vector<XPair> pairs;  // prefill: [group][block][pair]; decode: [block]
  std::vector<SVec> svecs;   // [group][block], Q4_1 only
};

template <DType T>
XPair make_pair(const BlockQ8A* lo, const BlockQ8A* hi) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(weight_bias(T)));
  XPair p;
  const __m256i qlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo->qs));
  const __m256i qhi = hi ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi->qs)) : _mm256_setzero_si256();
  p.q = _mm512_inserti64x4(_mm512_castsi256_si512(qlo), qhi, 1);
  p.nbias = has_min(T) ? _mm512_setzero_si512()
                             : _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, p.q));
  p.d = _mm512_insertf32x8(_mm512_set1_ps(lo->d), _mm256_set1_ps(hi ? hi->d : 0.0f), 1);
  return p;
}

// Prepares activation rows X[0, rows) (rows of nb blocks). Decode (rows == 1):
// block b of the row in both halves. Prefill: groups of kTile rows, pairs of
// rows (2p, 2p + 1) of a group (a missing row is zeros).
template <DType T>
void prep_x(const BlockQ8A* X, int nb, int rows, bool decode, XScratch& xs) {
  if (decode) {
    xs.pairs.resize(nb);
    if (has_min(T)) xs.svecs.resize(nb);
    for (int b = 0; b < nb; ++b) {
      xs.pairs[b] = make_pair<T>(X + b, X + b);
      if (has_min(T)) xs.svecs[b].s = _mm512_set1_ps(X[b].s);
    }
    return;
  }
  constexpr int xt = kXTile<T>, np = kPairs<T>;
  const int ng = (rows + xt - 1) / xt;
  xs.pairs.resize(static_cast<size_t>(ng) * nb * np);
  if (has_min(T)) xs.svecs.resize(static_cast<size_t>(ng) * nb);
  for (int g = 0; g < ng; ++g) {
    const int g_rows = std::min(xt, rows - g * xt);
    const BlockQ8A* xg = X + static_cast<size_t>(g) * xt * nb;
    for (int b = 0; b < nb; ++b) {
      XPair* out = &xs.pairs[(static_cast<size_t>(g) * nb + b) * np];
      for (int p = 0; p < np; ++p) {
        const int r = 2 * p;
        if (r >= g_rows) {
          out[p] = XPair{_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_ps()};
          continue;
        }
        out[p] = make_pair<T>(xg + static_cast<size_t>(r) * nb + b,
                              r + 1 < g_rows ? xg + static_cast<size_t>(r + 1) * nb + b : nullptr);
      }
      if (has_min(T)) {
        alignas(64) float s[16] = {};
        for (int j = 0; j < g_rows; ++j)
          for (int i = 0; i < kTile; ++i) s[i * kTile + j] = xg[static_cast<size_t>(j) * nb + b].s;
        xs.svecs[static_cast<size_t>(g) * nb + b].s = _mm512_load_ps(s);
      }
    }
  }
}

// The weight bytes of block b of rows pa (low half) and pb (high half) as 64
// unsigned bytes in element order, and their header halves packed as
// (d_a, m_a, d_b, m_b) (m = 0 for Q4_0 / Q5_0 / Q8_0). kSame: pa == pb.
template <DType T, bool kSame>
__m512i load_weights(const uint8_t* pa, const uint8_t* pb, uint64_t& header) {
  if constexpr (T == DType::Q8_0) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2));
    const __m512i both = kSame ? _mm512_broadcast_i64x4(lo)
                               : _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2)), 1);
    header = load_u16(pa) | static_cast<uint64_t>(load_u16(pb)) << 32;
    return _mm512_xor_si512(both, _mm512_set1_epi8(-128));
  } else {
    // 128-bit lanes [qs_a, qs_a, qs_b, qs_b] from 16-byte loads (never past
    // the block: the last row may end the buffer); the odd lanes then take
    // the high nibbles. (Masked loads would do too, but GCC treats them as
    // memory clobbers and then spills every accumulator each block.)
    constexpr bool q5 = T == DType::Q5_0 || T == DType::Q5_1;
    constexpr size_t qs_offset = (has_min(T) ? 4 : 2) + (q5 ? 4 : 0);
    const __m512i qa = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + qs_offset)));
    const __m512i u =
        kSame ? qa : _mm512_mask_broadcast_i32x4(qa, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + qs_offset)));
    if constexpr (has_min(T))
      header = load_u32(pa) | static_cast<uint64_t>(load_u32(pb)) << 32;
    else
      header = load_u16(pa) | static_cast<uint64_t>(load_u16(pb)) << 32;
    const __m512i shifted = _mm512_srlv_epi64(u, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    const __m512i nib = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
    if constexpr (!q5) return nib;
    // Q5_*: byte k of the vector is element k of row a (k < 32) or k - 32 of
    // row b, whose bit 4 is bit k of qh_a or k - 32 of qh_b.
    const uint64_t high = load_u32(pa + qs_offset - 4) | static_cast<uint64_t>(load_u32(pb + qs_offset - 4)) << 32;
    return _mm512_mask_add_epi8(nib, static_cast<__mmask64>(high), nib, _mm512_set1_epi8(16));
  }
}

// One tile. Weight slot k is the row pair (pa[k], pb[k]) of the two halves
// (prefill: the same row twice); activation slot p is xp[p] (decode: one).
// acc[k][p] accumulates the two halves' pairs.
//   decode:  NK <= 4 slots = weight rows (2k, 2k + 1) of the tile (nw rows), NP = 1
//   prefill: NK <= 4 slots = weight rows k, NP <= 2 activation pairs (nx rows)
template <DType T, bool kDecode, int NK, int NP>
void tile_q(const uint8_t* w0, size_t row_bytes, int nw, int nx, int nb, const XPair* xp, const SVec* sv,
            float* Y, size_t y_stride) {
  constexpr size_t bb = block_bytes(T);
  constexpr int xstride = kDecode ? 1 : kPairs<T>;  // XPairs per block
  const uint8_t* pa[NK];
  const uint8_t* pb[NK];
  for (int k = 0; k < NK; ++k) {
    if (kDecode) {
      pa[k] = w0 + 2 * k * row_bytes;
      pb[k] = w0 + std::min(2 * k + 1, nw - 1) * row_bytes;  // a missing row: a copy, thrown away
    } else {
      pa[k] = pb[k] = w0 + k * row_bytes;
    }
  }
  __m512 acc[NK][NP];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  __m512 summ = _mm512_setzero_ps();
  // H[4k + h] = (d_a, m_a, d_b, m_b)[h] of slot k. dw of slot k: H[4k] in the
  // low half, H[4k + 2] in the high half.
  // summ lane: decode: weight row l (m of row l is H[2l + 1]); prefill: lane
  // k * 4 + j is pair (row k, x row j) (m of row k is H[4k + 1]).
  const __m512i m_idx = kDecode ? _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15)
                                : _mm512_setr_epi32(1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13);
  // Each pair's lanes are one dependency chain, which stalls behind every
  // weight miss: ask for the next tile's bytes while this one computes
  // (decode streams all weights from memory; prefill their first pass).
  // Decode asks in address order, block b for its share of the next 8 rows:
  // one stream and 2-3 prefetches a block, where one per row and block (8)
  // took a sixth of the kernel's time (decode 1.11x on Gemma 3, whose Q5_0
  // takes this tile, 1.17x on SmolLM2's Q4_1; Zen 4, session 42).
  const uint8_t* next = w0 + 2 * kDecodeSlots * row_bytes;
  for (int b = 0; b < nb; ++b) {
    const size_t offset = b * bb;
    if constexpr (kDecode) {
      prefetch_lines(next + 2 * kDecodeSlots * offset, next + 2 * kDecodeSlots * (offset + bb));
    } else {
      for (int k = 0; k < NK; ++k) _mm_prefetch(reinterpret_cast<const char*>(pa[k] + offset + kTile * row_bytes), _MM_HINT_T0);
    }
    __m512i w[NK];
    uint64_t header[4] = {};
    for (int k = 0; k < NK; ++k) w[k] = load_weights<T, !kDecode>(pa[k] + offset, pb[k] + offset, header[k]);
    const __m512 H = _mm512_cvtph_ps(_mm256_setr_epi64x(static_cast<long long>(header[0]), static_cast<long long>(header[1]),
                                                        static_cast<long long>(header[2]), static_cast<long long>(header[3])));
    const XPair* x = xp + static_cast<size_t>(b) * xstride;
    for (int k = 0; k < NK; ++k) {
      const __m512 dw = _mm512_permutexvar_ps(
          _mm512_inserti64x4(_mm512_set1_epi32(4 * k), _mm256_set1_epi32(4 * k + 2), 1), H);
      for (int p = 0; p < NP; ++p) {
        const __m512i start = has_min(T) ? _mm512_setzero_si512() : x[p].nbias;
        const __m512 isum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w[k], x[p].q));
        acc[k][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, x[p].d), isum, acc[k][p]);
      }
    }
    if constexpr (has_min(T)) summ = _mm512_fmadd_ps(_mm512_permutexvar_ps(m_idx, H), sv[b].s, summ);
  }

  alignas(64) float summ_lanes[16];
  _mm512_store_ps(summ_lanes, summ);
  auto put = [&](int o, int r, __m256 half, int lane) {
    float dot = hsum8_ps(half);
    if (has_min(T)) dot = dot + summ_lanes[lane];
    Y[r * y_stride + o] = dot;
  };
  for (int k = 0; k < NK; ++k)
    for (int p = 0; p < NP; ++p) {
      const __m256 lo = _mm512_castps512_ps256(acc[k][p]), hi = _mm512_extractf32x8_ps(acc[k][p], 1);
      if (kDecode) {
        put(2 * k, 0, lo, 2 * k);
        if (2 * k + 1 < nw) put(2 * k + 1, 0, hi, 2 * k + 1);
      } else {
        if (2 * p < nx) put(k, 2 * p, lo, k * kTile + 2 * p);
        if (2 * p + 1 < nx) put(k, 2 * p + 1, hi, k * kTile + 2 * p + 1);
      }
    }
}

using TileQFn = void (*)(const uint8_t*, size_t, int, int, int, const XPair*, const SVec*, float*, size_t);

template <DType T, int NK>
TileQFn pick_np(int np) {
  switch (np) {
    case 1: return tile_q<T, false, NK, 1>;
    case 2: return tile_q<T, false, NK, 2>;
    case 3: return tile_q<T, false, NK, has_min(T) ? 2 : 3>;  // (never asked for with a min)
    default: return tile_q<T, false, NK, has_min(T) ? 2 : 4>;
  }
}

template <DType T>
TileQFn pick_prefill(int nw, int nx) {
  const int np = (nx + 1) / 2;
  switch (nw) {
    case 1: return pick_np<T, 1>(np);
    case 2: return pick_np<T, 2>(np);
    case 3: return pick_np<T, 3>(np);
    default: return pick_np<T, 4>(np);
  }
}

template <DType T>
TileQFn pick_decode(int nw) {
  switch ((nw + 1) / 2) {
    case 1: return tile_q<T, true, 1, 1>;
    case 2: return tile_q<T, true, 2, 1>;
    case 3: return tile_q<T, true, 3, 1>;
    default: return tile_q<T, true, 4, 1>;
  }
}

// Cache blocking. Activation rows are prepared in batches small enough to
// stay in L2; weight rows are swept in blocks that also fit in L2, and each
// group of 8 (or 4) activation rows (a few KB, in L1) meets the whole weight block
// before the next group. So weights come from memory once per batch and
// from L2 after that, and the prepared activations are read from L1.
constexpr size_t kPrepBudget = 256 * 1024;
constexpr size_t kWeightBlockBudget = 256 * 1024;

template <DType T>
void matmul_q_impl(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride) {
  thread_local XScratch xs;
  const int nb = n_in / QK;
  const size_t row_bytes = nb * block_bytes(T);
  const auto* wbase = static_cast<const uint8_t*>(W);
  if (n_x == 1) {
    prep_x<T>(Xq, nb, 1, true, xs);
    const SVec* sv = has_min(T) ? xs.svecs.data() : nullptr;
    constexpr int step = 2 * kDecodeSlots;
    for (int o = o0; o < o1; o += step) {
      const int nw = std::min(step, o1 - o);
      pick_decode<T>(nw)(wbase + o * row_bytes, row_bytes, nw, 1, nb, xs.pairs.data(), sv, Y + o, y_stride);
    }
    return;
  }
  constexpr int xt = kXTile<T>;
  const size_t prep_row_bytes = nb * (sizeof(XPair) / 2 + sizeof(SVec) / kTile);
  const int batch = std::max<int>(xt, static_cast<int>(kPrepBudget / prep_row_bytes) / xt * xt);
  const int w_block = std::max<int>(kTile, static_cast<int>(kWeightBlockBudget / row_bytes) / kTile * kTile);
  for (int r0 = 0; r0 < n_x; r0 += batch) {
    const int rows = std::min(batch, n_x - r0);
    prep_x<T>(Xq + static_cast<size_t>(r0) * nb, nb, rows, false, xs);
    for (int ob = o0; ob < o1; ob += w_block) {
      const int ob_end = std::min(o1, ob + w_block);
      for (int g = 0; g * xt < rows; ++g) {
        const int nx = std::min(xt, rows - g * xt);
        const XPair* xp = &xs.pairs[static_cast<size_t>(g) * nb * kPairs<T>];
        const SVec* sv = has_min(T) ? &xs.svecs[static_cast<size_t>(g) * nb] : nullptr;
        float* y = Y + (r0 + g * xt) * y_stride;
        for (int o = ob; o < ob_end; o += kTile) {
          const int nw = std::min(kTile, ob_end - o);
          pick_prefill<T>(nw, nx)(wbase + o * row_bytes, row_bytes, nw, nx, nb, xp, sv, y + o, y_stride);
        }
      }
    }
  }
}

}  // namespace

void matmul_q_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                     size_t y_stride, uint64_t x_id) {
  // From 16 activation rows on, unpacking each weight tile once (to memory)
  // beats unpacking it in registers per group of rows (quant_prefill_avx512.cpp);
  // with the zmm tiles, from 9 rows on, and from 8 for Q4_1 (Intel Xeon, one
  // core: 1.6-1.8x the rows kernel at 9-15 rows, and 1.0-1.2x Q4_1's at 8;
  // at 8 the rows kernel's own tile keeps Gemma's 168 MB Q8_0 output matrix
  // at 24 ms where the tiles take 30, and the register tiles beat them on
  // Q5_0). One row (decode) of Q8_0 has its own kernel
  // (quant_decode_avx512.cpp), and so have 2 to 16 rows (batched decode) of
  // Q4_1 and 2 to 32 of Q8_0 (quant_rows_avx512.cpp), except Q8_0's 4 to 8 rows with
  // the zmm tiles: there this file's register tiles, two pairs a zmm, are as
  // fast at 4 rows and 1.07-1.18x at 8 (Intel Xeon, Gemma 3's output matrix,
  // 2 threads; at 3 the half-empty second pair loses); Q8_0's 9 to 16 rows
  // take quant_rows_zmm_avx512.cpp, the rows kernel with two pairs a zmm
  // (1.2-1.5x the zmm tiles on that matrix: Gemma 3's 16 streams 1.09x).
  // Without the zmm tiles (Zen 4), the rows kernel keeps 16 rows of Q4_1 and
  // up to 32 of Q8_0: the output matrices stream from memory, where the
  // prefill tiles' unpacking to memory ran Gemma 3's at 0.7x the rows kernel
  // (16 rows; 0.8-0.85x at 24-32), and Gemma 3's 16 streams ran 1.24x; Q4_1's
  // 16 rows run alike either way from cache, and SmolLM2's 16 streams (whose
  // output matrix is 13% of a step) 0.98-1.07x (docs/PERFORMANCE.md, machine F).
  if (prefill_tiles() == PrefillTiles::zmm) {
    if (t == DType::Q8_0 && n_x >= 9 && n_x <= 16) return matmul_q_rows_zmm_avx512(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    if (t == DType::Q8_0 && n_x >= 4 && n_x <= 8) return matmul_q_impl<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    if (n_x >= (t == DType::Q4_1 ? 8 : 9)) return matmul_q_prefill_avx512(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  }
  if (matmul_q_rows_avx512(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride)) return;
  if (n_x >= 16) return matmul_q_prefill_avx512(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  if (n_x == 1 && matvec_q_avx512(t, W, n_in, o0, o1, Xq, Y)) return;
  switch (t) {
    case DType::Q4_0: return matmul_q_impl<DType::Q4_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q4_1: return matmul_q_impl<DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_0: return matmul_q_impl<DType::Q5_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_1: return matmul_q_impl<DType::Q5_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    default: return matmul_q_impl<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
  }
}

}  // namespace ctx::qk
