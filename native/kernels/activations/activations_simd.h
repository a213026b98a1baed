// The elementwise kernels' one body for both widths (activations.h has the
// orders): included by activations_avx2.cpp and activations_avx512.cpp, each
// built with its own flags (everything is in an anonymous namespace). A path
// V is a float vector of simd_f32.h with its own
//   exp(x)            exp_canonical, lane by lane (activations_impl.h)
//   gelu(x, table)    the table's GELU, lane by lane (activations.h)
//   Sums, add_squares(s, sq), store_sums(s, out)
//                     8 rows' sums of squares in double lanes: sq's float lanes added, one a row
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/activations/activations_impl.h"
#include "kernels/quant/simd_common.h"
#include "kernels/simd_f32.h"

namespace ctx::act {

namespace {

// x[i] = exp(x[i] - shift) and the sum of the results: chunks of 16 from
// i = 0 (lanes past n count as zero), each folded by hsum16's steps in float
// and added in double, in order.
template <typename V>
double exp_shift_sum_simd(float* x, int n, float shift) {
  const typename V::F s = V::set1(shift);
  double sum = 0.0;
  for (int i = 0; i < n; i += 16) {
    alignas(64) float c[16];
#pragma GCC unroll 2
    for (int k = 0; k < 16; k += V::kLanes) {
      const typename V::Mask m = V::first(n - i - k);
      const typename V::F e = V::zero_past(m, V::exp(V::sub(V::load(x + i + k, m), s)));
      V::store(x + i + k, m, e);
      V::storeu(c + k, e);
    }
    // hsum16: lanes i + 8, then hsum8's steps (i + 4, i + 2, i + 1).
    sum += static_cast<double>(qk::hsum8_ps(_mm256_add_ps(_mm256_load_ps(c), _mm256_load_ps(c + 8))));
  }
  return sum;
}

// g[i] = f(g[i]) * u[i], kLanes at a time, a partial vector last.
template <typename V, typename Fn>
void gated(float* g, const float* u, int n, Fn f) {
  int i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) V::storeu(g + i, V::mul(f(V::loadu(g + i)), V::loadu(u + i)));
  if (i < n) {
    const typename V::Mask m = V::first(n - i);
    V::store(g + i, m, V::mul(f(V::load(g + i, m)), V::load(u + i, m)));
  }
}

// silu(x) = x / (1 + exp(-x))
template <typename V>
void silu_mul_simd(float* g, const float* u, int n) {
  const typename V::F one = V::set1(1.0f);
  gated<V>(g, u, n, [&](typename V::F x) { return V::div(x, V::add(one, V::exp(V::sub(V::zero(), x)))); });
}

template <typename V>
void gelu_mul_simd(float* g, const float* u, int n, const uint16_t* table) {
  gated<V>(g, u, n, [&](typename V::F x) { return V::gelu(x, table); });
}


// RMS norm (activations.h), 8 rows at a time: each row's sum of squares is one
// double lane, its columns added in order, 8 columns a transposed block (a
// short last group repeats its last row and keeps only its own). Rows of a
// group of 1 or 2 sum alone, as the scalar path does.
template <typename V>
void rmsnorm_rows_simd(const float* x, const float* w, float* out, int n_rows, int n, float eps) {
  for (int r0 = 0; r0 < n_rows; r0 += 8) {
    const int nr = std::min(8, n_rows - r0);
    const float* xr[8];
    for (int r = 0; r < 8; ++r) xr[r] = x + static_cast<size_t>(r0 + std::min(r, nr - 1)) * n;
    alignas(64) double ss[8] = {};
    int i = 0;
    if (nr > 2) {
      typename V::Sums s = V::sums_zero();
      for (; i + 8 <= n; i += 8) {
        __m256 c[8];
        for (int r = 0; r < 8; ++r) c[r] = _mm256_loadu_ps(xr[r] + i);
        transpose8(c);  // c[j] = float j of the 8 rows
        for (int j = 0; j < 8; ++j) V::add_squares(s, _mm256_mul_ps(c[j], c[j]));
      }
      V::store_sums(s, ss);
    }
    for (int r = 0; r < nr; ++r) {
      double t = ss[r];
      for (int k = i; k < n; ++k) t += static_cast<double>(xr[r][k] * xr[r][k]);
      rms_scale(xr[r], w, out + static_cast<size_t>(r0 + r) * n, n, t, eps);
    }
  }
}

}  // namespace

}  // namespace ctx::act
