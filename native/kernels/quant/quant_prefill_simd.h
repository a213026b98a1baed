// The prefill matmul (many activation rows) for the blocks-of-32 integer
// types, its driver written once for both widths: included by
// quant_prefill_avx2.h and quant_prefill_avx512.cpp, each built with its
// own flags (everything is in an anonymous namespace).
//
// Per (weight row, activation row) pair one 8-lane accumulator holds the
// canonical lanes of quant.h, and block b adds acc = fma(sc, (float)isum, acc)
// with sc = f16(d_w[b]) * d_x[b] (a float product). What the inner loop would
// otherwise redo per tile is done once per call: weight tiles (kNK rows) are
// unpacked once per batch of activation rows; the activation rows are
// prepared once per call, by groups of kGroup rows (a float vector's lanes),
// or once per thread for all the calls that pass one x_id (quant.h: a
// matmul's chunks of output rows, and the matmuls that share an input);
// the scale table f16(d_w) * d_x and Q4_1 / Q5_1's min sums
// summ = fma(f16(m_w[b]), s_x[b], summ) are made per tile and group by one
// vector operation per (row, block), blocks in order. Every pair's lanes get
// their blocks in canonical order, so neither tiling nor batching changes a result.
//
// A path V is a float vector of simd_f32.h (kGroup = its lanes) with
//   kNK, kNX, kAhead        weight rows a tile, activation rows a sub-tile, tiles prefetched ahead (0: none)
//   kScaleGroups            activation groups whose scale tables are made in one pass (tile_scales)
//   kXRows                  activation rows an XBlock holds (1, or 2 where a register holds two pairs)
//   x_parts<T>()            XBlocks a prepared activation block of type T's matmul takes per row (a path
//                           may keep more than the quants: AVX2's bias sums of Q4_0 / Q5_0)
//   XBlock, WBlock          a prepared activation block (kXRows rows), an unpacked weight block
//   prep_x<T>, unpack_w<T>  into the Scratch below
//   tile<T, NK, NX>         NK weight rows x NX activation rows into Y
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/quant/quant_impl.h"
#include "kernels/simd_f32.h"

namespace ctx::qk {

namespace {

// Cache blocking: a batch of prepared activation rows stays in L2 and streams
// past each tile of weights (unpacked in L1).
constexpr size_t kXBudget = 256 * 1024;

template <typename V>
struct Lanes {  // one float per row of a group
  typename V::F v;
};

template <typename V>
struct Scratch {
  std::vector<typename V::XBlock> x;  // [group][block][row in group]
  std::vector<Lanes<V>> xd, xs;       // [group][block]: d_x, s_x of the group's rows
  std::vector<typename V::WBlock> wq;  // [tile row][block]; where a path's type needs a second operand
                                       // per block, it follows in the same layout from wq[kNK * nb]
  std::vector<float> wd, wm;           // [tile row][block]: f16(d_w), f16(m_w)
  std::vector<Lanes<V>> sc;            // [group slot][block][k]: f16(d_w) * d_x for tile row k, the group's rows
  std::vector<Lanes<V>> summ;          // [group slot][k]: the min sums of tile row k, the group's rows
  // What x holds: the rows of this x_id (0: none kept), at this address and
  // shape, prepared for weights with or without mins.
  uint64_t x_id = 0;
  const BlockQ8A* x_at = nullptr;
  int x_rows = 0, x_nb = 0;
  bool x_min = false;
};

// The activation scales d_x (and Q4_1 / Q5_1's sums s_x) of group g's rows
// for block b, as one vector each (rows past g_rows: 0). Written a float at a
// time straight into the tables, which are read long after: a vector load
// right behind the scalar stores would wait for them (no store forwarding).
template <DType T, typename V>
void group_scales(const BlockQ8A* X, int nb, int g, int g_rows, int b, Scratch<V>& s) {
  float* d = reinterpret_cast<float*>(&s.xd[static_cast<size_t>(g) * nb + b]);
  float* sx = reinterpret_cast<float*>(&s.xs[static_cast<size_t>(g) * nb + b]);
  for (int j = 0; j < g_rows; ++j) {
    const BlockQ8A& xb = X[static_cast<size_t>(g * V::kGroup + j) * nb + b];
    d[j] = xb.d;
    if (has_min(T)) sx[j] = xb.s;
  }
  for (int j = g_rows; j < V::kGroup; ++j) {
    d[j] = 0.0f;
    if (has_min(T)) sx[j] = 0.0f;
  }
}

// The XBlocks a group's prepared block takes (for weights of type T).
template <typename V, DType T>
constexpr size_t x_per_block() {
  return static_cast<size_t>(V::kGroup / V::kXRows * V::template x_parts<T>());
}

// Activation rows X[0, rows) (nb blocks each) into groups of kGroup rows:
// fill(out, first, g_rows) fills the group's block from its rows' blocks
// first[0], first[nb], ... (out: the group's x_per_block XBlocks of that
// block), then the block's scales go into their tables.
template <DType T, typename V, typename Fill>
void prep_groups(const BlockQ8A* X, int nb, int rows, Scratch<V>& s, Fill fill) {
  const int ng = (rows + V::kGroup - 1) / V::kGroup;
  const size_t blocks = static_cast<size_t>(ng) * nb, per_block = x_per_block<V, T>();
  if (s.x.size() < blocks * per_block) s.x.resize(blocks * per_block);
  if (s.xd.size() < blocks) {
    s.xd.resize(blocks);
    s.xs.resize(blocks);
  }
  for (int g = 0; g < ng; ++g) {
    const int g_rows = std::min(V::kGroup, rows - g * V::kGroup);
    for (int b = 0; b < nb; ++b) {
      fill(&s.x[(static_cast<size_t>(g) * nb + b) * per_block], &X[static_cast<size_t>(g) * V::kGroup * nb + b], g_rows);
      group_scales<T>(X, nb, g, g_rows, b, s);
    }
  }
}

// The scales (and min sums) of the unpacked tile against activation groups
// g0 .. g0 + ng - 1 (ng <= kScaleGroups), group i's at s.sc[i * kNK * nb] and
// s.summ[i * kNK]. One pass over the blocks: the table's stores and the min
// sums' fma chains (one per weight row and group, each a chain through the
// blocks in order) overlap, so more groups hide more of the fma latency.
template <typename V, DType T>
void tile_scales(Scratch<V>& s, int g0, int ng, int nb) {
  constexpr int kNK = V::kNK, kSG = V::kScaleGroups;
  const float* wd = s.wd.data();
  const float* wm = s.wm.data();
  typename V::F summ[kSG][kNK];
  for (auto& row : summ)
    for (auto& v : row) v = V::zero();
  for (int b = 0; b < nb; ++b) {
    // Loaded once per block: the table's stores (vectors, which may alias
    // anything) would have them reloaded otherwise.
    typename V::F dw[kNK], mw[kNK];
    for (int k = 0; k < kNK; ++k) {
      dw[k] = V::set1(wd[k * nb + b]);
      mw[k] = has_min(T) ? V::set1(wm[k * nb + b]) : V::zero();
    }
    for (int i = 0; i < kSG; ++i) {
      if (i >= ng) break;
      const size_t gb = static_cast<size_t>(g0 + i) * nb + b;
      const typename V::F d = s.xd[gb].v, sx = has_min(T) ? s.xs[gb].v : V::zero();
      Lanes<V>* sc = &s.sc[(static_cast<size_t>(i) * nb + b) * kNK];
      for (int k = 0; k < kNK; ++k) {
        sc[k].v = V::mul(dw[k], d);
        if (has_min(T)) summ[i][k] = V::fma(mw[k], sx, summ[i][k]);
      }
    }
  }
  if (has_min(T))
    for (int i = 0; i < ng; ++i)
      for (int k = 0; k < kNK; ++k) s.summ[i * kNK + k].v = summ[i][k];
}

template <typename V>
using TileFn = void (*)(const typename V::WBlock*, const typename V::XBlock*, const float*, const float*, int, float*,
                        size_t);

template <typename V, DType T, int NK, int NX = V::kNX>
TileFn<V> pick_nx(int nx) {
  if constexpr (NX == 1) {
    return V::template tile<T, NK, 1>;
  } else {
    return nx >= NX ? V::template tile<T, NK, NX> : pick_nx<V, T, NK, NX - 1>(nx);
  }
}

template <typename V, DType T, int NK = V::kNK>
TileFn<V> pick(int nk, int nx) {
  if constexpr (NK == 1) {
    return pick_nx<V, T, 1>(nx);
  } else {
    return nk >= NK ? pick_nx<V, T, NK>(nx) : pick<V, T, NK - 1>(nk, nx);
  }
}

// The unpacked tile (nk rows) against activation group g (g_rows rows), its
// scales at table slot i (tile_scales); Y is offset to (the group's row 0,
// the tile's first row).
template <typename V, DType T>
void run_tile(Scratch<V>& s, int nk, int i, int g, int g_rows, int nb, float* Y, size_t y_stride) {
  const auto* sc = reinterpret_cast<const float*>(&s.sc[static_cast<size_t>(i) * V::kNK * nb]);
  const auto* summ = reinterpret_cast<const float*>(&s.summ[static_cast<size_t>(i) * V::kNK]);
  const typename V::XBlock* xg = &s.x[static_cast<size_t>(g) * nb * x_per_block<V, T>()];
  for (int j = 0; j < g_rows; j += V::kNX) {
    const int nx = std::min(V::kNX, g_rows - j);
    pick<V, T>(nk, nx)(s.wq.data(), xg + j / V::kXRows, sc + j, summ + j, nb, Y + j * y_stride, y_stride);
  }
}

template <typename V, DType T>
void matmul_prefill(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride,
                    uint64_t x_id) {
  thread_local Scratch<V> s;
  constexpr int kNK = V::kNK, kGroup = V::kGroup;
  const int nb = n_in / QK;
  const size_t row_bytes = nb * block_bytes_q(T);
  const auto* wbase = static_cast<const uint8_t*>(W);
  const size_t x_row_bytes = nb * (sizeof(typename V::XBlock) * V::template x_parts<T>() / V::kXRows + 2 * sizeof(float));
  const int batch = std::max<int>(kGroup, static_cast<int>(kXBudget / x_row_bytes) / kGroup * kGroup);
  const size_t tile_blocks = static_cast<size_t>(kNK) * nb;
  if (s.wd.size() < tile_blocks) {
    s.wq.resize(2 * tile_blocks);
    s.wd.resize(tile_blocks);
    s.wm.resize(tile_blocks);
  }
  s.sc.resize(tile_blocks * V::kScaleGroups);
  s.summ.resize(kNK * V::kScaleGroups);
  if (x_id == 0 || x_id != s.x_id || Xq != s.x_at || n_x != s.x_rows || nb != s.x_nb || has_min(T) != s.x_min) {
    V::template prep_x<T>(Xq, nb, n_x, s);
    s.x_id = x_id, s.x_at = Xq, s.x_rows = n_x, s.x_nb = nb, s.x_min = has_min(T);
  }
  for (int r0 = 0; r0 < n_x; r0 += batch) {
    const int rows = std::min(batch, n_x - r0), g0 = r0 / kGroup;
    for (int o = o0; o < o1; o += kNK) {
      const int nk = std::min(kNK, o1 - o);
      // Weights are read once per batch of activation rows, in the model from
      // memory: the rows of the tile kAhead tiles on are asked for while this one computes.
      if constexpr (V::kAhead > 0) {
        const int ahead = o + V::kAhead * kNK;
        if (ahead < o1) {
          const uint8_t* p = wbase + ahead * row_bytes;
          const size_t bytes = std::min(kNK, o1 - ahead) * row_bytes;
          for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
        }
      }
      V::template unpack_w<T>(wbase + o * row_bytes, row_bytes, nk, nb, s);
      const int groups = (rows + kGroup - 1) / kGroup;
      for (int g = 0; g < groups; g += V::kScaleGroups) {
        const int ng = std::min(V::kScaleGroups, groups - g);
        tile_scales<V, T>(s, g0 + g, ng, nb);
        for (int i = 0; i < ng; ++i) {
          const int r = (g + i) * kGroup;
          run_tile<V, T>(s, nk, i, g0 + g + i, std::min(kGroup, rows - r), nb, Y + (r0 + r) * y_stride + o, y_stride);
        }
      }
    }
  }
}

template <typename V>
void matmul_q_prefill_simd(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                           size_t y_stride, uint64_t x_id) {
  switch (t) {
    case DType::Q4_0: return matmul_prefill<V, DType::Q4_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
    case DType::Q4_1: return matmul_prefill<V, DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
    case DType::Q5_0: return matmul_prefill<V, DType::Q5_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
    case DType::Q5_1: return matmul_prefill<V, DType::Q5_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
    default: return matmul_prefill<V, DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  }
}

}  // namespace

}  // namespace ctx::qk
