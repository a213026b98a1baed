#include "models/attention.h"

#include <cmath>

#include "core/cpu.h"
#include "quant/quant.h"

namespace ctx {

static void scores_scalar(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  for (int j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int d = 0; d < hd; ++d) acc = std::fma(q[d], f16_to_f32(kt[static_cast<size_t>(d) * stride + j]), acc);
    scores[j] = acc * scale;
  }
}

void attn_scores_f16(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores) {
  switch (active_isa()) {
    case Isa::avx512: return attn::scores_avx512(q, kt, hd, stride, n, scale, scores);
    case Isa::avx2: return attn::scores_avx2(q, kt, hd, stride, n, scale, scores);
    default: return scores_scalar(q, kt, hd, stride, n, scale, scores);
  }
}

}  // namespace ctx
