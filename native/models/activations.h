// Elementwise math of the forward pass (softmax, SiLU) with one exp that every
// SIMD path computes bit-identically: the same IEEE operations in the same
// order (range reduction by fma, a fixed polynomial, scaling by 2^n built from
// the exponent bits). libm's expf would differ between the scalar and vector
// paths, and across libm versions.
#pragma once

namespace ctx {

// x[i] = exp(x[i] - shift); returns the sum of the results, accumulated in 16
// lanes (lane i % 16, ascending i) and folded by hsum16 (see quant/quant.h).
float exp_shift_sum(float* x, int n, float shift);

// g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i]
void silu_mul(float* g, const float* u, int n);

// The canonical exp of one float (the scalar reference of all paths).
float exp_canonical(float x);

}  // namespace ctx
