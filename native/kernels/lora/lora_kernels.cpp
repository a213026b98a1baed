#include <cmath>

#include "kernels/lora/lora_kernels.h"
#include "kernels/quant/quant.h"

namespace ctx::lora {

namespace {

float widen(float v) { return v; }
float widen(uint16_t h) { return f16_to_f32(h); }
float widen(Bf16 h) { return bf16_to_f32(h.bits); }

template <typename T>
void up_rows(const T* bt, int rank, int o0, int o1, const float* t, int n_x, float factor, float* y,
             size_t y_stride) {
  for (int r = 0; r < n_x; ++r) {
    const float* tr = t + static_cast<size_t>(r) * rank;
    float* yr = y + r * y_stride;
    for (int o = o0; o < o1; ++o) {
      float acc[16] = {};
      for (int j = 0; j < rank; ++j) acc[j % 16] = std::fma(widen(bt[blocked_index(j, o, rank)]), tr[j], acc[j % 16]);
      for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) acc[i] = acc[i] + acc[i + w];
      yr[o] = yr[o] + factor * acc[0];
    }
  }
}

}  // namespace

void up_scalar(const float* bt, int rank, int /*n_out*/, int o0, int o1, const float* t, int n_x, float factor, float* y,
               size_t y_stride) {
  up_rows(bt, rank, o0, o1, t, n_x, factor, y, y_stride);
}

void up_f16_scalar(const uint16_t* bt, int rank, int /*n_out*/, int o0, int o1, const float* t, int n_x, float factor,
                   float* y, size_t y_stride) {
  up_rows(bt, rank, o0, o1, t, n_x, factor, y, y_stride);
}

void up_bf16_scalar(const uint16_t* bt, int rank, int /*n_out*/, int o0, int o1, const float* t, int n_x, float factor,
                    float* y, size_t y_stride) {
  up_rows(reinterpret_cast<const Bf16*>(bt), rank, o0, o1, t, n_x, factor, y, y_stride);
}

}  // namespace ctx::lora
