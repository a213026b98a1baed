// The Q4_K and Q6_K matmuls from kKTilesFromRows activation rows (prefill, batched
// decode) with the weight rows as lanes, one body per type for both widths: a
// tile of V::kRows weight rows (one per int32 lane) is unpacked once, then each
// activation row meets all of them at once, so the canonical float steps of
// quant.h (Q4_K: one fma per 64 values, one per pair of mins; Q6_K: a multiply
// and an fma per super-block) are done for kRows pairs by one vector
// instruction instead of after a horizontal sum each.
//
// Included by ktiles_avx2.h (8 rows a ymm) and ktiles_avx512.cpp (16 rows a
// zmm), each built with its own flags; everything here is in an anonymous
// namespace, so each translation unit keeps its own copy (see quant_impl.h on
// inline functions and ISA flags). A path V gives:
//   kRows, kNX            weight rows per tile, activation rows per pass over it
//   F, I, Raw, Mask       float and int32 vectors, a sub-block's raw sums, a store mask
//   TileBlock, unpack     one Q4_K super-block of a tile, lane j = weight row j, and its unpacking
//   Q6Block, unpack_q6    the same for Q6_K
//   dot4(raw, wq, x)      raw plus wq's bytes times the 4 activation bytes at x, per lane
//   scaled(raw, sc)       the sub-block's sum times its scale, as int32
//   mins(m, pair)         vpmaddwd of packed int16 pairs against an activation pair
//   kQ6Groups, kQ6Start   Q6_K: groups of 4 values a raw sum takes (4: a sub-block); whether a
//                         raw sum starts at -32 * the sub-block's bsum (start(v)), which takes
//                         the weights' offset of 32 in the int32 sums (otherwise: one correction
//                         a super-block by vpmaddwd, scale pairs against bsum pairs)
//   rows(n), store(p, m, v)
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/quant/quant_impl.h"

namespace ctx::qk {

namespace {

// The 4 activation bytes at p, as one int32.
inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The tile's rows against NX activation rows x (rows of nb blocks; q8s:
// their q8s pairs, 4 per block), in the canonical Q4_K order of quant.h.
template <typename V, int NX>
void tile_rows(const typename V::TileBlock* tb, int nb, const BlockQ8K* x, const int32_t* q8s, float* Y,
               size_t y_stride, typename V::Mask store) {
  using F = typename V::F;
  using I = typename V::I;
  F acc1[NX], accm[NX];
  for (int r = 0; r < NX; ++r) acc1[r] = accm[r] = V::zero();
  for (int i = 0; i < nb; ++i) {
    const typename V::TileBlock& t = tb[i];
    for (int k = 0; k < 4; ++k) {
      I isum[NX];
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * k + h;
        typename V::Raw raw[NX];
        for (int r = 0; r < NX; ++r) raw[r] = V::zero_raw();
        for (int g = 0; g < 8; ++g) {
          const I wq = t.q[s][g];
          for (int r = 0; r < NX; ++r) raw[r] = V::dot4(raw[r], wq, x[static_cast<size_t>(r) * nb + i].qs + 32 * s + 4 * g);
        }
        for (int r = 0; r < NX; ++r) {
          const I scaled = V::scaled(raw[r], t.sc[s]);
          isum[r] = h ? V::add_i(isum[r], scaled) : scaled;
        }
      }
      for (int r = 0; r < NX; ++r) {
        const size_t ri = static_cast<size_t>(r) * nb + i;
        const F yd = V::set1(x[ri].d);
        acc1[r] = V::fma(V::cvt(isum[r]), V::mul(t.d, yd), acc1[r]);
        accm[r] = V::fma(V::cvt(V::mins(t.mins[k], q8s[4 * ri + k])), V::mul(t.dmin, yd), accm[r]);
      }
    }
  }
  for (int r = 0; r < NX; ++r) V::store(Y + r * y_stride, store, V::sub(acc1[r], accm[r]));
}

// The tile's rows against NX activation rows x, in Q6_K's canonical order
// (quant.h: one exact sum a super-block, times f16(w.d), then an fma with
// y.d). corr: per activation row and super-block, 16 int32s: V::kQ6Start's
// starts -32 * bsums[s], or the pairs bsums[2m] | bsums[2m + 1] << 16 (m < 8).
template <typename V, int NX>
void tile_rows_q6k(const typename V::Q6Block* tb, int nb, const BlockQ8K* x, const int32_t* corr, float* Y,
                   size_t y_stride, typename V::Mask store) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int kG = V::kQ6Groups;
  F acc[NX];
  for (int r = 0; r < NX; ++r) acc[r] = V::zero();
  for (int i = 0; i < nb; ++i) {
    const typename V::Q6Block& t = tb[i];
    I isum[NX];
    for (int s = 0; s < 16; ++s) {
      for (int g0 = 0; g0 < 4; g0 += kG) {
        typename V::Raw raw[NX];
        for (int r = 0; r < NX; ++r) {
          if constexpr (V::kQ6Start) raw[r] = V::start(corr[(static_cast<size_t>(r) * nb + i) * 16 + s]);
          else raw[r] = V::zero_raw();
        }
        for (int g = g0; g < g0 + kG; ++g) {
          const I wq = t.q[s][g];
          for (int r = 0; r < NX; ++r) raw[r] = V::dot4(raw[r], wq, x[static_cast<size_t>(r) * nb + i].qs + 16 * s + 4 * g);
        }
        for (int r = 0; r < NX; ++r) {
          const I scaled = V::scaled(raw[r], t.sc[s]);
          isum[r] = s + g0 ? V::add_i(isum[r], scaled) : scaled;
        }
      }
    }
    for (int r = 0; r < NX; ++r) {
      const size_t ri = static_cast<size_t>(r) * nb + i;
      if constexpr (!V::kQ6Start) {  // isum -= 32 * (sum of sc[s] * bsums[s])
        I c = V::mins(t.scp[0], corr[16 * ri]);
        for (int m = 1; m < 8; ++m) c = V::add_i(c, V::mins(t.scp[m], corr[16 * ri + m]));
        isum[r] = V::sub_i(isum[r], V::shl5(c));
      }
      acc[r] = V::fma(V::mul(V::cvt(isum[r]), t.d), V::set1(x[ri].d), acc[r]);
    }
  }
  for (int r = 0; r < NX; ++r) V::store(Y + r * y_stride, store, acc[r]);
}

// A type's tiles: its unpacked block, its unpacking, its activation rows'
// integers (kInts a super-block) and its tile body.
template <typename V, DType T>
struct KTiles;

template <typename V>
struct KTiles<V, DType::Q4_K> {
  using Block = typename V::TileBlock;
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_K);
  static constexpr auto unpack = V::unpack;
  static constexpr int kInts = 4;
  static void activations(const BlockQ8K* x, size_t n, int32_t* out) { q8s_pairs(x, n, out); }
  template <int NX>
  static void tile(const Block* tb, int nb, const BlockQ8K* x, const int32_t* q8s, float* Y, size_t y_stride,
                   typename V::Mask store) {
    tile_rows<V, NX>(tb, nb, x, q8s, Y, y_stride, store);
  }
};

template <typename V>
struct KTiles<V, DType::Q6_K> {
  using Block = typename V::Q6Block;
  static constexpr size_t kBlockBytes = sizeof(BlockQ6_K);
  static constexpr auto unpack = V::unpack_q6;
  static constexpr int kInts = 16;
  static void activations(const BlockQ8K* x, size_t n, int32_t* out) { q6k_corr(x, n, V::kQ6Start, out); }
  template <int NX>
  static void tile(const Block* tb, int nb, const BlockQ8K* x, const int32_t* corr, float* Y, size_t y_stride,
                   typename V::Mask store) {
    tile_rows_q6k<V, NX>(tb, nb, x, corr, Y, y_stride, store);
  }
};

template <typename V, DType T>
using TileRowsFn = void (*)(const typename KTiles<V, T>::Block*, int, const BlockQ8K*, const int32_t*, float*, size_t,
                            typename V::Mask);

template <typename V, DType T, int... NX>
TileRowsFn<V, T> tile_rows_for(int nx, std::integer_sequence<int, NX...>) {
  static constexpr TileRowsFn<V, T> fns[] = {KTiles<V, T>::template tile<NX + 1>...};
  return fns[nx - 1];
}

template <typename V, DType T>
void matmul_tiles(const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y, size_t y_stride) {
  using K = KTiles<V, T>;
  const int nb = n_in / QK_K;
  const int row_bytes = nb * static_cast<int>(K::kBlockBytes);
  const auto* wbase = static_cast<const uint8_t*>(W);
  thread_local std::vector<int32_t> ints;  // the activation rows' integers (K::activations)
  ints.resize(static_cast<size_t>(n_x) * nb * K::kInts);
  K::activations(Xk, static_cast<size_t>(n_x) * nb, ints.data());
  thread_local std::vector<typename K::Block> tile;
  tile.resize(nb);
  constexpr auto seq = std::make_integer_sequence<int, V::kNX>{};
  for (int o = o0; o < o1; o += V::kRows) {
    const int n_rows = std::min(V::kRows, o1 - o);
    for (int i = 0; i < nb; ++i) K::unpack(wbase + static_cast<size_t>(o) * row_bytes, row_bytes, n_rows, i, tile[i]);
    const typename V::Mask store = V::rows(n_rows);
    for (int r = 0; r < n_x; r += V::kNX) {
      const int nx = std::min(V::kNX, n_x - r);
      tile_rows_for<V, T>(nx, seq)(tile.data(), nb, Xk + static_cast<size_t>(r) * nb,
                                   ints.data() + static_cast<size_t>(r) * nb * K::kInts, Y + r * y_stride + o, y_stride,
                                   store);
    }
  }
}

// Q4_K or Q6_K (the callers' check) by the tiles.
template <typename V>
void matmul_ktiles(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                   size_t y_stride) {
  if (t == DType::Q6_K) return matmul_tiles<V, DType::Q6_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
  matmul_tiles<V, DType::Q4_K>(W, n_in, o0, o1, Xk, n_x, Y, y_stride);
}

}  // namespace

}  // namespace ctx::qk
