#include "models/activations.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include <vector>

#include "core/cpu.h"
#include "quant/quant.h"
#include "models/activations_impl.h"

namespace ctx {

using namespace act;

float exp_canonical(float x) {
  const bool under = x < kMinX;
  x = std::fmin(std::fmax(x, kMinX), kMaxX);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kP0;
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  float y = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  y = y * scale;
  return under ? 0.0f : y;
}

static float hsum16(float* a) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

static float exp_shift_sum_scalar(float* x, int n, float shift) {
  float acc[16] = {0};
  for (int i = 0; i < n; ++i) {
    x[i] = exp_canonical(x[i] - shift);
    acc[i % 16] = acc[i % 16] + x[i];
  }
  return hsum16(acc);
}

static void silu_mul_scalar(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.0f + exp_canonical(0.0f - g[i])) * u[i];
}

namespace {

// f16 bits -> f16 bits of the tanh GELU, built once (thread-safe static init).
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t h = 0; h < t.size(); ++h) {
      const double x = f16_to_f32(static_cast<uint16_t>(h));
      const double y = 0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * x * (1.0 + 0.044715 * x * x)));
      t[h] = f32_to_f16(static_cast<float>(y));
    }
    return t;
  }();
  return table;
}

}  // namespace

void gelu_mul(float* g, const float* u, int n) {
  const uint16_t* table = gelu_table().data();
  for (int i = 0; i < n; ++i) {
    const float x = g[i];
    const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : f16_to_f32(table[f32_to_f16(x)]);
    g[i] = y * u[i];
  }
}

float exp_shift_sum(float* x, int n, float shift) {
  switch (active_isa()) {
    case Isa::avx512: return exp_shift_sum_avx512(x, n, shift);
    case Isa::avx2: return exp_shift_sum_avx2(x, n, shift);
    default: return exp_shift_sum_scalar(x, n, shift);
  }
}

void silu_mul(float* g, const float* u, int n) {
  switch (active_isa()) {
    case Isa::avx512: return silu_mul_avx512(g, u, n);
    case Isa::avx2: return silu_mul_avx2(g, u, n);
    default: return silu_mul_scalar(g, u, n);
  }
}

}  // namespace ctx
