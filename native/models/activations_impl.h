// Constants and per-ISA entry points of activations.cpp. The polynomial is
// Cephes' expf on [-ln2/2, ln2/2].
#pragma once

namespace ctx::act {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;      // ln 2 split so n * hi is exact
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMaxX = 88.3762626647949f;  // exp overflows past this
constexpr float kMinX = -87.3365447504f;    // results below are flushed to 0
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

float exp_shift_sum_avx2(float* x, int n, float shift);
void silu_mul_avx2(float* g, const float* u, int n);
float exp_shift_sum_avx512(float* x, int n, float shift);
void silu_mul_avx512(float* g, const float* u, int n);

}  // namespace ctx::act
