// AVX2 prefill (many activation rows) for the blocks-of-32 integer types:
// quant_prefill_avx512.cpp's scheme with AVX2's integer dot product.
//
// Per (weight row, activation row) pair, one ymm accumulator holds the 8
// canonical lanes, and block b adds acc = fma(sc, (float)isum, acc) with
// sc = f16(d_w[b]) * d_x[b] (a float product) broadcast from a per-tile table.
// The int32 4-sums come from vpmaddubsw (u8 x s8 -> int16 pairs) and vpmaddwd
// with ones, exact for these operands (no int16 saturation):
//   Q4_1, Q5_1: q (0..31) x x (|x| <= 127): 2 * 31 * 127 = 7874;
//   Q4_0, Q5_0: the same with q, then the bias taken back in int32 by adding
//     nbias = -bias * (x's 4-sums), prepared with the activations;
//   Q8_0: the sign trick, |w| x (x with w's sign): 2 * 128 * 127 = 32512.
// Weight tiles are unpacked once per batch of activation rows; the
// activation rows are prepared once per call; every pair's lanes get their
// blocks in canonical order, so tiling never changes a result.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr int kGroup = 8;  // activation rows per scale vector (ymm lanes)
constexpr int kNK = 2;     // weight rows per tile (16 ymm registers)
constexpr int kNX = 4;     // activation rows per tile (sub-tiles of a group)
constexpr size_t kXBudget = 256 * 1024;  // prepared activation rows, in L2

struct XBlock { __m256i q; __m256i nbias; };  // one prepared activation block
struct WBlock { __m256i u; __m256i sign; };   // the unsigned operand; Q8_0: the signed weights
struct Lanes8 { __m256 v; };                  // one float per row of a group

struct Scratch {
  std::vector<XBlock> x;       // [group][block][row in group]
  std::vector<Lanes8> xd, xs;  // [group][block]: d_x, s_x of the group's rows
  std::vector<WBlock> wq;      // [tile row][block]
  std::vector<float> wd, wm;   // [tile row][block]: f16(d_w), f16(m_w)
  std::vector<Lanes8> sc;      // [block][k]: f16(d_w) * d_x for tile row k, the group's rows
  Lanes8 summ[kNK];            // the min sums of tile row k, the group's rows
};

constexpr int weight_bias(DType t) { return t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : 0; }

// The 32 bits at p as 32 bytes, 0x10 where the bit is set (Q5_*'s bit 4).
__m256i high_bits(const uint8_t* p) { return _mm256_and_si256(bytes_from_bits(p), _mm256_set1_epi8(0x10)); }

template <DType T>
void prep_x(const BlockQ8A* X, int nb, int rows, Scratch& s) {
  const int ng = (rows + kGroup - 1) / kGroup;
  if (s.x.size() < static_cast<size_t>(ng) * nb * kGroup) s.x.resize(static_cast<size_t>(ng) * nb * kGroup);
  if (s.xd.size() < static_cast<size_t>(ng) * nb) {
    s.xd.resize(static_cast<size_t>(ng) * nb);
    s.xs.resize(static_cast<size_t>(ng) * nb);
  }
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(weight_bias(T)));
  for (int g = 0; g < ng; ++g) {
    const int g_rows = std::min(kGroup, rows - g * kGroup);
    for (int b = 0; b < nb; ++b) {
      alignas(32) float d[kGroup] = {}, sx[kGroup] = {};
      XBlock* out = &s.x[(static_cast<size_t>(g) * nb + b) * kGroup];
      for (int j = 0; j < g_rows; ++j) {
        const BlockQ8A& xb = X[static_cast<size_t>(g * kGroup + j) * nb + b];
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
        out[j].q = q;
        if (weight_bias(T) != 0) {
          const __m256i sum4 = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, q), _mm256_set1_epi16(1));
          out[j].nbias = _mm256_sub_epi32(_mm256_setzero_si256(), sum4);
        }
        d[j] = xb.d;
        sx[j] = xb.s;
      }
      s.xd[static_cast<size_t>(g) * nb + b].v = _mm256_load_ps(d);
      s.xs[static_cast<size_t>(g) * nb + b].v = _mm256_load_ps(sx);
    }
  }
}

// Weight rows [0, nk) from w (row_bytes apart) into the tile buffers (kNK
// rows; a short tile's missing rows keep stale values, never read).
template <DType T>
void unpack_w(const uint8_t* w, size_t row_bytes, int nk, int nb, Scratch& s) {
  constexpr size_t bb = block_bytes_q(T);
  constexpr bool q5 = T == DType::Q5_0 || T == DType::Q5_1;
  constexpr size_t qs_offset = (has_min(T) ? 4 : 2) + (q5 ? 4 : 0);
  for (int o = 0; o < nk; ++o) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = w + o * row_bytes + b * bb;
      WBlock& out = s.wq[static_cast<size_t>(o) * nb + b];
      if constexpr (T == DType::Q8_0) {
        out.sign = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
        out.u = _mm256_abs_epi8(out.sign);
      } else {
        // Elements 0..15 are the low nibbles, 16..31 the high ones.
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_offset));
        out.u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
        if constexpr (q5) out.u = _mm256_or_si256(out.u, high_bits(p + qs_offset - 4));
      }
      s.wd[static_cast<size_t>(o) * nb + b] = _cvtsh_ss(load_u16(p));
      if (has_min(T)) s.wm[static_cast<size_t>(o) * nb + b] = _cvtsh_ss(load_u16(p + 2));
    }
  }
}

// The scales (and min sums) of the unpacked tile against activation group g.
template <DType T>
void tile_scales(Scratch& s, int g, int nb) {
  // One pass: the table's stores and the min sums' fma chains overlap.
  const float* wd = s.wd.data();
  const float* wm = s.wm.data();
  const Lanes8* xd = &s.xd[static_cast<size_t>(g) * nb];
  const Lanes8* xs = &s.xs[static_cast<size_t>(g) * nb];
  __m256 summ[kNK];
  for (auto& v : summ) v = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b)
    for (int k = 0; k < kNK; ++k) {
      s.sc[b * kNK + k].v = _mm256_mul_ps(_mm256_set1_ps(wd[k * nb + b]), xd[b].v);
      if (has_min(T)) summ[k] = _mm256_fmadd_ps(_mm256_set1_ps(wm[k * nb + b]), xs[b].v, summ[k]);
    }
  if (has_min(T))
    for (int k = 0; k < kNK; ++k) s.summ[k].v = summ[k];
}

// One tile: NK weight rows x NX activation rows (x: row j of the group's
// block b at x[b * kGroup + j]); sc and summ offset to the tile's first row.
template <DType T, int NK, int NX>
void tile(const WBlock* wq, const XBlock* x, const float* sc, const float* summ, int nb, float* Y, size_t y_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NK][NX];
  for (auto& row : acc)
    for (auto& a : row) a = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const XBlock* xb = x + b * kGroup;
    const float* scb = sc + b * kNK * kGroup;
    for (int k = 0; k < NK; ++k) {
      const WBlock& w = wq[k * nb + b];
      for (int j = 0; j < NX; ++j) {
        const __m256i q = T == DType::Q8_0 ? _mm256_sign_epi8(xb[j].q, w.sign) : xb[j].q;
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w.u, q), ones);
        if (weight_bias(T) != 0) dot = _mm256_add_epi32(dot, xb[j].nbias);
        acc[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(scb[k * kGroup + j]), _mm256_cvtepi32_ps(dot), acc[k][j]);
      }
    }
  }
  for (int k = 0; k < NK; ++k)
    for (int j = 0; j < NX; ++j) {
      float dot = hsum8_ps(acc[k][j]);
      if (has_min(T)) dot = dot + summ[k * kGroup + j];
      Y[j * y_stride + k] = dot;
    }
}

using TileFn = void (*)(const WBlock*, const XBlock*, const float*, const float*, int, float*, size_t);

template <DType T, int NK, int NX = kNX>
TileFn pick_nx(int nx) {
  if constexpr (NX == 1) {
    return tile<T, NK, 1>;
  } else {
    return nx >= NX ? tile<T, NK, NX> : pick_nx<T, NK, NX - 1>(nx);
  }
}

template <DType T>
TileFn pick(int nk, int nx) {
  return nk >= 2 ? pick_nx<T, 2>(nx) : pick_nx<T, 1>(nx);
}

template <DType T>
void matmul_prefill(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride) {
  thread_local Scratch s;
  const int nb = n_in / QK;
  const size_t row_bytes = nb * block_bytes_q(T);
  const auto* wbase = static_cast<const uint8_t*>(W);
  const size_t x_row_bytes = nb * (sizeof(XBlock) + 2 * sizeof(float));
  const int batch = std::max<int>(kGroup, static_cast<int>(kXBudget / x_row_bytes) / kGroup * kGroup);
  const size_t tile_blocks = static_cast<size_t>(kNK) * nb;
  if (s.wq.size() < tile_blocks) {
    s.wq.resize(tile_blocks);
    s.wd.resize(tile_blocks);
    s.wm.resize(tile_blocks);
    s.sc.resize(tile_blocks);
  }
  const auto* sc = reinterpret_cast<const float*>(s.sc.data());
  const auto* summ = reinterpret_cast<const float*>(s.summ);
  for (int r0 = 0; r0 < n_x; r0 += batch) {
    const int rows = std::min(batch, n_x - r0);
    prep_x<T>(Xq + static_cast<size_t>(r0) * nb, nb, rows, s);
    for (int o = o0; o < o1; o += kNK) {
      const int nk = std::min(kNK, o1 - o);
      unpack_w<T>(wbase + o * row_bytes, row_bytes, nk, nb, s);
      for (int g = 0; g * kGroup < rows; ++g) {
        const int g_rows = std::min(kGroup, rows - g * kGroup);
        tile_scales<T>(s, g, nb);
        const XBlock* xg = &s.x[static_cast<size_t>(g) * nb * kGroup];
        for (int j = 0; j < g_rows; j += kNX)
          pick<T>(nk, std::min(kNX, g_rows - j))(s.wq.data(), xg + j, sc + j, summ + j, nb,
                                                 Y + (r0 + static_cast<size_t>(g) * kGroup + j) * y_stride + o, y_stride);
      }
    }
  }
}

}  // namespace

void matmul_q_prefill_avx2(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                           size_t y_stride) {
  switch (t) {
    case DType::Q4_0: return matmul_prefill<DType::Q4_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q4_1: return matmul_prefill<DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_0: return matmul_prefill<DType::Q5_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_1: return matmul_prefill<DType::Q5_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    default: return matmul_prefill<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
  }
}

}  // namespace ctx::qk
