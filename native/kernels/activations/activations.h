// Elementwise math of the forward pass (softmax, SiLU) with one exp that every
// SIMD path computes bit-identically: the same IEEE operations in the same
// order (ggml's exp, activations_impl.h: range reduction by fma, a fixed
// polynomial, one scaling by 2^n). libm's expf would differ between the
// scalar and vector paths, and across libm versions.
#pragma once

namespace ctx {

// x[i] = exp(x[i] - shift); returns the sum of the results as llama.cpp's
// softmax sums them: chunks of 16 from i = 0 (the last one zero-padded), each
// folded by hsum16 (kernels/quant/quant.h) in float and added in double, in order.
double exp_shift_sum(float* x, int n, float shift);

// g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i]
void silu_mul(float* g, const float* u, int n);

// g[i] = gelu(g[i]) * u[i] with the tanh GELU looked up in a table of every
// f16 input, as llama.cpp computes it (GGML_GELU_FP16): for -10 < x < 10,
// gelu(x) = f32(table[f16(x)]), table[h] = f16(gelu(f32(h))) evaluated in
// float with the C library's tanhf, exactly as llama.cpp builds its table
// (a C library whose tanhf rounds differently would change a few entries);
// x <= -10 gives 0 and x >= 10 gives x. The vector paths gather from the
// same table, so every path gives the same bits.
void gelu_mul(float* g, const float* u, int n);

// RoPE of n_heads heads of hd values in place, the first `half` pairs of each:
// pair i is (v[i], v[i + half]) (NeoX) or (v[2i], v[2i + 1]); cs holds the
// angles' cos[half] then sin[half]. With the FMAs llama.cpp's compiler makes:
//   v[a] = fma(x0, cos, -(x1 * sin));  v[b] = fma(x0, sin, x1 * cos)
void rope_heads(float* v, int n_heads, int hd, int half, bool neox, const float* cs);

// RMS norm of n_rows rows of n (contiguous; out may be x), each as llama.cpp
// computes it: ss = the float squares x[i] * x[i] summed in a double, i
// ascending; mean = (float)(ss / n); scale = 1 / sqrt(mean + eps) in float;
// out[i] = x[i] * scale * w[i]. The SIMD paths take 8 rows at a time, one
// double lane each, so each row's sum keeps its own order.
void rmsnorm_rows(const float* x, const float* w, float* out, int n_rows, int n, float eps);

// The canonical exp of one float (the scalar reference of all paths).
float exp_canonical(float x);

}  // namespace ctx
