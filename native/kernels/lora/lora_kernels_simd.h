// lora::up (lora_kernels.h) on a float vector V of simd_f32.h: V::kLanes
// outputs o side by side, one lane each, so a short rank costs no horizontal
// sum. Included by lora_kernels_avx2.cpp and lora_kernels_avx512.cpp, each
// built with its own flags (everything is in an anonymous namespace).
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/lora/lora_kernels.h"
#include "kernels/simd_f32.h"

namespace ctx::lora {

namespace {

template <typename V>
typename V::F load_b(const float* p) { return V::loadu(p); }
template <typename V>
typename V::F load_b(const uint16_t* p) { return V::load_f16(p); }
template <typename V>
typename V::F load_b(const Bf16* p) { return V::load_bf16(&p->bits); }

void up_head(const float* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  up_scalar(bt, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}
void up_head(const uint16_t* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  up_f16_scalar(bt, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}
void up_head(const Bf16* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  up_bf16_scalar(&bt->bits, rank, n_out, o0, o1, t, n_x, factor, y, y_stride);
}

// One group of V::kLanes outputs from b, their bt[0, o] (the next j kBlock
// further on; a group lies inside one block, read whole: the block's padding
// is there), into the lanes of m: acc[j % 16] = fma(bt[j, o], t[j], acc[j % 16])
// over ascending j, then hsum16, then y + factor * dot. Each acc[i] is
// finished before the next starts, and its w = 8 sum (acc[i] + acc[i + 8])
// taken at once, so only 8 partial sums and 2 accumulators are live: they stay
// in registers even with AVX2's 16, and the values are those of that order.
template <typename V, bool kFull, int kRank, typename T>
void up_group(const T* b, int rank, const float* tr, typename V::F f, float* yo, typename V::Mask m) {
  using F = typename V::F;
  if constexpr (kRank > 0) rank = kRank;  // a constant: the j loops below unroll away
  auto acc = [&](int i) {  // acc[i] of the order above
    F a = V::zero();
    for (int j = i; j < rank; j += 16) a = V::fma(load_b<V>(b + static_cast<size_t>(j) * kBlock), V::set1(tr[j]), a);
    return a;
  };
  F s[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) s[i] = V::add(acc(i), acc(i + 8));
  for (int w = 4; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) s[i] = V::add(s[i], s[i + w]);
  // y + factor * dot, a multiply then an add, in every lane.
  if constexpr (kFull) V::storeu(yo, V::add(V::loadu(yo), V::mul(f, s[0])));
  else V::store(yo, m, V::add(V::load(yo, m), V::mul(f, s[0])));
}

// Outputs before the first multiple of V::kLanes (a chunk that starts inside a
// group: never in the model, whose chunks start at multiples of 16) take the
// scalar path, which gives the same bits.
template <typename V, typename T>
void up_simd(const T* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  const int head = std::min(o1, (o0 + V::kLanes - 1) / V::kLanes * V::kLanes);
  if (o0 < head) up_head(bt, rank, n_out, o0, head, t, n_x, factor, y, y_stride);
  const typename V::F f = V::set1(factor);
  for (int r = 0; r < n_x; ++r) {
    const float* tr = t + static_cast<size_t>(r) * rank;
    float* yr = y + r * y_stride;
    int o = head;
    if (rank == 16) {  // the usual rank, its loops unrolled
      for (; o + V::kLanes <= o1; o += V::kLanes)
        up_group<V, true, 16>(bt + blocked_index(0, o, rank), rank, tr, f, yr + o, V::first(V::kLanes));
    } else {
      for (; o + V::kLanes <= o1; o += V::kLanes)
        up_group<V, true, 0>(bt + blocked_index(0, o, rank), rank, tr, f, yr + o, V::first(V::kLanes));
    }
    if (o < o1) up_group<V, false, 0>(bt + blocked_index(0, o, rank), rank, tr, f, yr + o, V::first(o1 - o));
  }
}

}  // namespace

}  // namespace ctx::lora
