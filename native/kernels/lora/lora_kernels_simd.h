// lora::up (lora_kernels.h) on a float vector V of simd_f32.h: V::kLanes
// outputs o side by side, one lane each, so a short rank costs no horizontal
// sum. Included by lora_kernels_avx2.cpp and lora_kernels_avx512.cpp, each
// built with its own flags (everything is in an anonymous namespace).
#pragma once

#include <cstddef>

#include "kernels/lora/lora_kernels.h"
#include "kernels/simd_f32.h"

namespace ctx::lora {

namespace {

template <typename V>
typename V::F load_b(const float* p, typename V::Mask m) { return V::load(p, m); }
template <typename V>
typename V::F load_b(const uint16_t* p, typename V::Mask m) { return V::load_f16(p, m); }

template <typename V, typename T>
void up_simd(const T* bt, int rank, int n_out, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  using F = typename V::F;
  const F f = V::set1(factor);
  for (int r = 0; r < n_x; ++r) {
    const float* tr = t + static_cast<size_t>(r) * rank;
    float* yr = y + r * y_stride;
    for (int o = o0; o < o1; o += V::kLanes) {
      const typename V::Mask m = V::first(o1 - o);
      F acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = V::zero();
      for (int j = 0; j < rank; ++j)
        acc[j % 16] = V::fma(load_b<V>(bt + static_cast<size_t>(j) * n_out + o, m), V::set1(tr[j]), acc[j % 16]);
      for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) acc[i] = V::add(acc[i], acc[i + w]);
      // y + factor * dot, a multiply then an add, in every lane.
      V::store(yr + o, m, V::add(V::load(yr + o, m), V::mul(f, acc[0])));
    }
  }
}

}  // namespace

}  // namespace ctx::lora
