// The attention kernels' one body for both widths, in the orders of
// attention.h: included by attention_avx2.cpp (8 keys or values a ymm) and
// attention_avx512.cpp (16 a zmm), each built with its own flags; everything
// here is in an anonymous namespace, so each translation unit keeps its own
// copy. A path V is a float vector of simd_f32.h (F32x8, F32x16) with
//   kAcc, kMaxGroup          the scores' accumulators it keeps live at most, the queries a pass
//   kAccChunks, kRegs        the weighted sums' accumulators at most; the vector registers
//
// G queries that read one KV head (the heads that share it, of one row or of
// several rows over the same pages) go through K and V together, in the
// orders of attention.h, so each K or V row is loaded and widened once for
// all G queries. Scores: query g's register (g, r) holds its partial sums
// over d = r (mod 16), R registers at a time (G x R of them, a key and a
// query's value within kRegs; one query takes kAcc). Weighted sums: a
// pass takes one slot of the pages and D registers of each query's output
// (G x D of them, G weights and a value within kRegs: none spilled), whole
// cache lines of each V row where D allows. Each query's 16 partial
// sums are then folded by hsum16's steps, lane by lane. A query gets the
// same bits alone or in a group.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/attention.h"
#include "kernels/prefetch.h"

namespace ctx::attn {

namespace {

// acc[0] = hsum16 of the 16 registers, lane by lane: for w in 8, 4, 2, 1: acc[i] += acc[i + w].
template <typename V>
inline typename V::F fold16(typename V::F* acc) {
#pragma GCC unroll 4
  for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
    for (int i = 0; i < w; ++i) acc[i] = V::add(acc[i], acc[i + w]);
  return acc[0];
}

// f(std::integral_constant<int, G>{}, h0) for the queries h0 .. h0 + G - 1
// of a group of g, at most V::kMaxGroup a call.
template <int G, typename Fn>
void with_group(int n, int h0, Fn& f) {
  if constexpr (G == 1) {
    f(std::integral_constant<int, 1>{}, h0);
  } else {
    if (n == G) return f(std::integral_constant<int, G>{}, h0);
    with_group<G - 1>(n, h0, f);
  }
}

template <typename V, typename Fn>
void by_groups(int g, Fn f) {
  for (int h0 = 0; h0 < g; h0 += V::kMaxGroup) with_group<V::kMaxGroup>(std::min(V::kMaxGroup, g - h0), h0, f);
}

// Scores of G queries (q: G rows of hd) against kLanes keys from j0 (full:
// all of them, so a path's partial-vector handling drops out of the loop);
// key(d, j0, m) gives dimension d of keys j0.. (lanes outside m zero).
template <typename V, int G, bool kFull, typename Key>
inline void score_block(const float* q, int hd, int n, int j0, float scale, float* scores, int score_stride, Key key) {
  using F = typename V::F;
  // G x R sums, a key and a query's value in registers (one query spills a few: that measured faster than two passes)
  constexpr int R = G == 1 ? V::kAcc : std::min(V::kAcc, V::kRegs - 2) / G;
  const typename V::Mask m = V::first(kFull ? V::kLanes : n - j0);
  alignas(64) F part[G][16];
  for (int rb = 0; rb < 16; rb += R) {
    const int nr = 16 % R == 0 ? R : std::min(R, 16 - rb);
    F acc[G][R];
#pragma GCC unroll 16
    for (int i = 0; i < G * R; ++i) acc[i / R][i % R] = V::zero();
    for (int d0 = rb; d0 < hd; d0 += 16)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if (r >= nr) break;
        const F k = key(d0 + r, j0, m);
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) acc[g][r] = V::fma(V::set1(q[g * hd + d0 + r]), k, acc[g][r]);
      }
#pragma GCC unroll 16
    for (int i = 0; i < G * R; ++i)
      if (i % R < nr) part[i / R][rb + i % R] = acc[i / R][i % R];
  }
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) V::store(scores + g * score_stride + j0, m, V::mul(fold16<V>(part[g]), V::set1(scale)));
}

// Scores of G queries against one K block, kLanes keys a register.
template <typename V, int G, typename Key>
__attribute__((noinline)) void score_keys(const float* q, int hd, int n, float scale, float* scores, int score_stride,
                                          Key key) {
  int j0 = 0;
  for (; j0 + V::kLanes <= n; j0 += V::kLanes) score_block<V, G, true>(q, hd, n, j0, scale, scores, score_stride, key);
  if (j0 < n) score_block<V, G, false>(q, hd, n, j0, scale, scores, score_stride, key);
}

template <typename V, typename Key>
void score_heads(const float* q, int g, int hd, int n, float scale, float* scores, int score_stride, Key key) {
  by_groups<V>(g, [&](auto G, int h0) {
    score_keys<V, decltype(G)::value>(q + h0 * hd, hd, n, scale, scores + h0 * score_stride, score_stride, key);
  });
}

// Pages a block of the weighted sums takes (accumulate_heads). From memory
// (decode), the next block's rows are asked for meanwhile: 4-16 measured
// alike, 2 at 0.72x (the sums' stores and loads each block), at 4,000 keys on
// Zen 3; 32 or 64 at 0.90x on Zen 4 (SmolLM2, one row over 4,000 keys). In
// cache (a prompt's rows, hot), a block's fixed work is the cost: on Zen 4,
// blocks of 64 ran 1.5x 8 at 512 keys, 1.2x at 200 (a bundle of a row's 4
// heads, head size 256, or of 15 queries at 64), asking ahead or not alike.
constexpr int kPageBlock = 8, kHotPageBlock = 64;

// The weighted sums of V for G queries, kLanes values of the output a
// register, over pages of 16 keys (slot = key % 16): query g sums its keys
// [0, n[g]) into out[g]. value(g, i, j, d0) gives values d0.. of slot j of
// query g's page i; weight(g, i, j, d0) the weight that meets them (kByDim:
// it depends on d0; otherwise it is read once a key). Pages [0, shared) are
// one page for every query: up to `full` (those whose 16 keys every query
// sees) one load of a V row serves all G queries unconditionally; past it
// each query takes only its own keys, in the same order.
//
// A pass takes one slot j and D registers of the output (D * kLanes values
// of each V row, whole cache lines) for each of the G queries: register
// (g, c) sums query g's keys in slot j over the pages in order, which is the
// partial sum of attention.h's order; the 16 slots' sums are then folded by
// hsum16's steps. So a key costs D loads of V and G weights for G * D fmas.
// The passes go a block of pages at a time (kPageBlock, or kHotPageBlock
// where hot), the partial sums kept between blocks; where(i, j, d0) is the
// address of value(0, i, j, d0), for asking for the next block's rows ahead.
template <typename V, int G, bool kByDim, typename Value, typename Weight, typename Where>
void accumulate_heads(const int* n, int shared, int hd, float* const* out, bool hot, Value value, Weight weight,
                      Where where) {
  using F = typename V::F;
  // G x D sums, G weights and a value in registers (none spilled: a spill costs more than a pass)
  constexpr int D = std::max(1, std::min(V::kAccChunks, V::kRegs - 1 - G) / G);
  constexpr bool kHoist = !kByDim && D > 1;  // one broadcast of a key's weight for its D registers
  int n_min = n[0], n_max = n[0];
  for (int g = 1; g < G; ++g) n_min = std::min(n_min, n[g]), n_max = std::max(n_max, n[g]);
  const int full = std::min(shared, n_min / 16), n_pages = (n_max + 15) / 16;
  const int chunks = hd / V::kLanes, block = hot ? kHotPageBlock : kPageBlock;
  for (int c0 = 0; c0 < chunks; c0 += D) {
    const int nd = std::min(D, chunks - c0);
    // Slot j's sums after its last page, in the canonical lanes, for the fold.
    alignas(64) F part[G][D][16];
    // Slot j's pages past the full ones, each query only its own keys (and
    // its own V past the shared pages), in the same order.
    const auto tail = [&](int j, F (&acc)[G][D]) {
      for (int i = full; i < n_pages; ++i) {
        const int k = i * 16 + j;
        if (k >= n_max) break;
        const bool one = i < shared;
#pragma GCC unroll 16
        for (int c = 0; c < D; ++c) {
          if (c >= nd) break;
          const int d0 = (c0 + c) * V::kLanes;
          const F v = one ? value(0, i, j, d0) : V::zero();
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g)
            if (k < n[g]) acc[g][c] = V::fma(V::set1(weight(g, i, j, d0)), one ? v : value(g, i, j, d0), acc[g][c]);
        }
      }
    };
    // The full pages a block at a time, every slot of a block before the
    // next block, whose rows are asked for meanwhile (a slot's pass over every
    // page, as before, read one line a page, each from a page 368 KB from the
    // last on SmolLM2: at 4,000 keys, 8 GB/s). Register (g, c) still sums
    // slot j over the pages in order, carried from block to block in part;
    // the first block starts it at zero and the last goes on into the tail
    // while it is in registers (in cache, each pass through part cost ~10%).
    for (int b0 = 0; b0 < full; b0 += block) {
      const int b1 = std::min(full, b0 + block), next = std::min(full, b1 + block);
      for (int j = 0; j < 16; ++j) {
        for (int i = b1; i < next; ++i) prefetch_lines(where(i, j, c0 * V::kLanes), where(i, j, (c0 + nd) * V::kLanes));
        F acc[G][D];
#pragma GCC unroll 16
        for (int i = 0; i < G * D; ++i)
          acc[i / D][i % D] = b0 == 0 ? V::zero() : part[i / D][i % D][j];
        for (int i = b0; i < b1; ++i) {
          F w[G];
          if constexpr (kHoist) {
#pragma GCC unroll 16
            for (int g = 0; g < G; ++g) w[g] = V::set1(weight(g, i, j, 0));
          }
#pragma GCC unroll 16
          for (int c = 0; c < D; ++c) {
            if (c >= nd) break;
            const int d0 = (c0 + c) * V::kLanes;
            const F v = value(0, i, j, d0);
#pragma GCC unroll 16
            for (int g = 0; g < G; ++g)
              acc[g][c] = V::fma(kHoist ? w[g] : V::set1(weight(g, i, j, d0)), v, acc[g][c]);
          }
        }
        if (b1 == full) tail(j, acc);
#pragma GCC unroll 16
        for (int i = 0; i < G * D; ++i)
          if (i % D < nd) part[i / D][i % D][j] = acc[i / D][i % D];
      }
    }
    if (full == 0) {
      for (int j = 0; j < 16; ++j) {
        F acc[G][D];
#pragma GCC unroll 16
        for (int i = 0; i < G * D; ++i) acc[i / D][i % D] = V::zero();
        tail(j, acc);
#pragma GCC unroll 16
        for (int i = 0; i < G * D; ++i)
          if (i % D < nd) part[i / D][i % D][j] = acc[i / D][i % D];
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < nd; ++c) V::storeu(out[g] + (c0 + c) * V::kLanes, fold16<V>(part[g][c]));
  }
}

template <typename V, bool kByDim, typename Value, typename Weight, typename Where>
void accumulate_group(const float* p, int p_stride, int g, const int* n, int shared, int hd, float* const* out,
                      bool hot, Value value, Weight weight, Where where) {
  by_groups<V>(g, [&](auto G, int h0) {
    accumulate_heads<V, decltype(G)::value, kByDim>(
        n + h0, shared, hd, out + h0, hot, [&](int h, int i, int j, int d0) { return value(h0 + h, i, j, d0); },
        [&](int h, int i, int j, int d0) {
          return weight(p + static_cast<size_t>(h0 + h) * p_stride, h0 + h, i, j, d0);
        }, where);
  });
}

// The four entry points of a path, by the table's signatures (attention.h).
template <typename V>
void path_scores(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* out,
            int score_stride) {
  score_heads<V>(q, g, hd, n, scale, out, score_stride, [&](int d, int j0, typename V::Mask m) {
    return V::load_f16(kt + static_cast<size_t>(d) * stride + j0, m);
  });
}

template <typename V>
void path_scores_q8(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
               float* out, int score_stride) {
  score_heads<V>(q, g, hd, n, scale, out, score_stride, [&](int d, int j0, typename V::Mask m) {
    const typename V::F s = V::load_f16(ks + static_cast<size_t>(d / 32) * stride + j0, m);
    return V::mul(s, V::load_i8(kq + static_cast<size_t>(d) * stride + j0, m));
  });
}

template <typename V>
void path_accumulate(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared,
                     int v_stride, const int* n, int hd, float* const* out, bool hot) {
  accumulate_group<V, false>(
      p, p_stride, g, n, shared, hd, out, hot,
      [&](int h, int i, int j, int d0) { return V::load_f16(pages[h][i] + d0 + j * v_stride); },
      [](const float* ph, int, int i, int j, int) { return ph[i * 16 + j]; },
      [&](int i, int j, int d0) { return reinterpret_cast<const char*>(pages[0][i] + d0 + j * v_stride); });
}

template <typename V>
void path_accumulate_q8(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                        const uint16_t* const* const* scales, int shared, int v_stride, int s_stride, const int* n,
                        int hd, float* const* out, bool hot) {
  // The q8 weight is p times the scale of the value's block of 32 (attention.h).
  accumulate_group<V, true>(
      p, p_stride, g, n, shared, hd, out, hot,
      [&](int h, int i, int j, int d0) { return V::load_i8(pages[h][i] + d0 + j * v_stride); },
      [&](const float* ph, int h, int i, int j, int d0) {
        return ph[i * 16 + j] * _cvtsh_ss(scales[h][i][j * s_stride + d0 / 32]);
      },
      [&](int i, int j, int d0) { return reinterpret_cast<const char*>(pages[0][i] + d0 + j * v_stride); });
}

}  // namespace

}  // namespace ctx::attn
