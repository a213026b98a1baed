#include "kernels/activations/activations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <vector>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"
#include "kernels/activations/activations_impl.h"

namespace ctx {

using namespace act;

// j * 2^n rounded once, for integral n (AVX-512's scalef): 2^n is built from
// its exponent bits, in two steps where it is not a normal float.
static float scale2(float j, int n) {
  auto pow2 = [](int e) {
    const int32_t bits = (e + 127) << 23;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  };
  if (n < -126) return (j * pow2(n + 126)) * pow2(-126);  // exact, then one rounding into the subnormals
  if (n > 127) return (j * pow2(127)) * pow2(n - 127);     // overflows to inf, as scalef does
  return j * pow2(n);
}

float exp_canonical(float x) {
  const float z = std::fma(x, kLog2e, kShift);
  const float n = z - kShift;
  if (n != n) return n;  // NaN in, NaN out
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, std::fma(kC1, b, 1.0f));
  return scale2(j, static_cast<int>(n));
}

static float hsum16(float* a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

double act::exp_shift_sum_scalar(float* x, int n, float shift) {
  double sum = 0.0;
  for (int c = 0; c < n; c += 16) {
    float chunk[16] = {0};
    for (int i = c; i < n && i < c + 16; ++i) chunk[i - c] = x[i] = exp_canonical(x[i] - shift);
    sum += static_cast<double>(hsum16(chunk));
  }
  return sum;
}

void act::silu_mul_scalar(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.0f + exp_canonical(0.0f - g[i])) * u[i];
}

namespace {

// f16 bits -> f16 bits of the tanh GELU, built once (thread-safe static init).
// Two entries past the end: the vector paths gather 32 bits at entry h.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t((1 << 16) + 2, 0);
    // ggml_gelu_f32 in float, with the one FMA its compiler makes of 1 + a x x,
    // and the C library's tanhf (as llama.cpp's table uses it).
    for (uint32_t h = 0; h < (1u << 16); ++h) {
      const float x = f16_to_f32(static_cast<uint16_t>(h));
      const float inner = std::fma(0.044715f * x, x, 1.0f);
      const float y = (0.5f * x) * (1.0f + std::tanh((0.79788456080286535588f * x) * inner));
      t[h] = f32_to_f16(y);
    }
    return t;
  }();
  return table;
}

}  // namespace

void act::gelu_mul_scalar(float* g, const float* u, int n, const uint16_t* table) {
  for (int i = 0; i < n; ++i) {
    const float x = g[i];
    const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : f16_to_f32(table[f32_to_f16(x)]);
    g[i] = y * u[i];
  }
}

void act::rope_scalar(float* v, int n_heads, int hd, int half, bool neox, const float* cs) {
  for (int h = 0; h < n_heads; ++h, v += hd)
    for (int i = 0; i < half; ++i) {
      const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const float c = cs[i], s = cs[half + i], x0 = v[a], x1 = v[b];
      v[a] = std::fma(x0, c, -(x1 * s));
      v[b] = std::fma(x0, s, x1 * c);
    }
}

void rope_heads(float* v, int n_heads, int hd, int half, bool neox, const float* cs) {
  kernels().rope(v, n_heads, hd, half, neox, cs);
}

void gelu_mul(float* g, const float* u, int n) { kernels().gelu_mul(g, u, n, gelu_table().data()); }

double exp_shift_sum(float* x, int n, float shift) { return kernels().exp_shift_sum(x, n, shift); }

void silu_mul(float* g, const float* u, int n) { kernels().silu_mul(g, u, n); }

// Rows' sums interleaved 8 at a time (each still in its own order): the sum is
// one long dependency chain a row.
void act::rmsnorm_rows_scalar(const float* x, const float* w, float* out, int n_rows, int n, float eps) {
  constexpr int kChains = 8;
  for (int r0 = 0; r0 < n_rows; r0 += kChains) {
    const int nr = std::min(kChains, n_rows - r0);
    double ss[kChains] = {0};
    const float* xr = x + static_cast<size_t>(r0) * n;
    for (int i = 0; i < n; ++i)
      for (int r = 0; r < nr; ++r) ss[r] += static_cast<double>(xr[r * n + i] * xr[r * n + i]);
    for (int r = 0; r < nr; ++r) rms_scale(xr + static_cast<size_t>(r) * n, w, out + static_cast<size_t>(r0 + r) * n, n, ss[r], eps);
  }
}

void rmsnorm_rows(const float* x, const float* w, float* out, int n_rows, int n, float eps) {
  kernels().rmsnorm_rows(x, w, out, n_rows, n, eps);
}

}  // namespace ctx
