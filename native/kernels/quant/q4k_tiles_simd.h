// The Q4_K matmul for 2 or more activation rows (prefill, batched decode)
// with the weight rows as lanes, one body for both widths: a tile of V::kRows
// weight rows (one per int32 lane) is unpacked once, then each activation row
// meets all of them at once, so the canonical float steps of quant.h (one fma
// per 64 values, one per pair of mins) are done for kRows pairs by one vector
// instruction instead of after a horizontal sum each.
//
// Included by q4k_tiles_avx2.h (8 rows a ymm) and q4k_tiles_avx512.cpp (16
// rows a zmm), each built with its own flags; everything here is in an
// anonymous namespace, so each translation unit keeps its own copy (see
// quant_impl.h on inline functions and ISA flags). A path V gives:
//   kRows, kNX            weight rows per tile, activation rows per pass over it
//   F, I, Raw, Mask       float and int32 vectors, a sub-block's raw sums, a store mask
//   TileBlock, unpack     one super-block of a tile, lane j = weight row j, and its unpacking
//   dot4(raw, wq, x)      raw plus wq's bytes times the 4 activation bytes at x, per lane
//   scaled(raw, sc)       the sub-block's sum times its scale, as int32
//   mins(m, pair)         vpmaddwd of the packed mins against a q8s pair
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

template <typename V>
using TileRowsFn = void (*)(const typename V::TileBlock*, int, const BlockQ8K*, const int32_t*, float*, size_t,
                            typename V::Mask);

template <typename V, int... NX>
TileRowsFn<V> tile_rows_for(int nx, std::integer_sequence<int, NX...>) {
  static constexpr TileRowsFn<V> fns[] = {tile_rows<V, NX + 1>...};
  return fns[nx - 1];
}

template <typename V>
void matmul_q4k_tiles(const void* W, int n_in, int o0, int o1, const BlockQ8K* Xk, int n_x, float* Y,
                      size_t y_stride) {
  const int nb = n_in / QK_K;
  const int row_bytes = nb * static_cast<int>(sizeof(BlockQ4_K));
  const auto* wbase = static_cast<const uint8_t*>(W);
  thread_local std::vector<int32_t> q8s;
  q8s.resize(static_cast<size_t>(n_x) * nb * 4);
  q8s_pairs(Xk, static_cast<size_t>(n_x) * nb, q8s.data());
  thread_local std::vector<typename V::TileBlock> tile;
  tile.resize(nb);
  constexpr auto seq = std::make_integer_sequence<int, V::kNX>{};
  for (int o = o0; o < o1; o += V::kRows) {
    const int n_rows = std::min(V::kRows, o1 - o);
    for (int i = 0; i < nb; ++i) V::unpack(wbase + static_cast<size_t>(o) * row_bytes, row_bytes, n_rows, i, tile[i]);
    const typename V::Mask store = V::rows(n_rows);
    for (int r = 0; r < n_x; r += V::kNX) {
      const int nx = std::min(V::kNX, n_x - r);
      tile_rows_for<V>(nx, seq)(tile.data(), nb, Xk + static_cast<size_t>(r) * nb,
                                q8s.data() + static_cast<size_t>(r) * nb * 4, Y + r * y_stride + o, y_stride, store);
    }
  }
}

}  // namespace

}  // namespace ctx::qk
