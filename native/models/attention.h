// Attention scores over one page's dimension-major K block (kv/page_pool.h).
//
// Canonical order, the same on every SIMD path: for each key j,
//   acc = 0; for d in 0..hd-1 (ascending): acc = fma(q[d], f16(kt[d * stride + j]), acc)
//   scores[j] = acc * scale
// Keys are independent lanes, so a vector op scores 16 (or 8) keys at once and
// no horizontal sum is needed.
#pragma once

#include <cstdint>

namespace ctx {

// kt: the head's K rows, hd rows of `stride` (= page_tokens) f16 values; scores n <= stride keys.
void attn_scores_f16(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores);

namespace attn {
void scores_avx2(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores);
void scores_avx512(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores);
}  // namespace attn

}  // namespace ctx
