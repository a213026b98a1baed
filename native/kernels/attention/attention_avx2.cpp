// Attention kernels on AVX2 (attention_simd.h): 8 keys or values a ymm and
// 16 registers. Up to 4 queries that read one KV head go through K and V
// together, as on AVX-512 (a K or V row loaded and widened once for all of
// them): the scores hold R = 14 / G residues of each query a pass (one query
// alone keeps all 16 and lets the compiler spill a few, which measured faster
// than two passes of 8), the weighted sums D = (15 - G) / G registers of each
// query's output (at most 12). Groups of 4 made the kernels 1.5-1.9x single
// queries and a 512-token prefill 1.06x (docs/PERFORMANCE.md, session 21);
// 8 or 16 a group spill and lose.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/attention/attention_simd.h"
#include "kernels/simd_f32.h"

namespace ctx::attn {

namespace {

struct Avx2 : F32x8 {
  static constexpr int kAcc = 16, kMaxGroup = 4;  // the scores' sums at most; queries a group
  static constexpr int kAccChunks = 12, kRegs = 16;  // the weighted sums' at most; the vector registers
};

}  // namespace

void scores_avx2(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                 int score_stride) {
  path_scores<Avx2>(q, g, kt, hd, stride, n, scale, scores, score_stride);
}

void scores_q8_avx2(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,
                    float scale, float* scores, int score_stride) {
  path_scores_q8<Avx2>(q, g, kq, ks, hd, stride, n, scale, scores, score_stride);
}

void accumulate_avx2(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared,
                    int /*pt: 16*/, int v_stride, const int* n, int hd, float* const* out, bool hot) {
  path_accumulate<Avx2>(p, p_stride, g, pages, shared, v_stride, n, hd, out, hot);
}

void accumulate_q8_avx2(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                       const uint16_t* const* const* scales, int shared, int /*pt: 16*/, int v_stride, int s_stride,
                       const int* n, int hd, float* const* out, bool hot) {
  path_accumulate_q8<Avx2>(p, p_stride, g, pages, scales, shared, v_stride, s_stride, n, hd, out, hot);
}

float max_avx2(const float* x, int n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = lanes[0];
  for (int j = 1; j < 8; ++j) r = std::fmax(r, lanes[j]);
  for (; i < n; ++i) r = std::fmax(r, x[i]);
  return r;
}

void scale_round_avx2(float* x, int n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  if (i < n) {
    alignas(32) float tmp[8] = {0};
    std::memcpy(tmp, x + i, sizeof(float) * (n - i));
    const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_load_ps(tmp), s), _MM_FROUND_TO_NEAREST_INT);
    _mm256_store_ps(tmp, _mm256_cvtph_ps(h));
    std::memcpy(x + i, tmp, sizeof(float) * (n - i));
  }
}

}  // namespace ctx::attn
