// Attention over paged K and V (kv/page_pool.h), in llama.cpp's (non-flash)
// reduction orders, so its logits, the reference we are held to, come out
// bit for bit (tests/test_model.py compares). Every SIMD path follows them.
//
// Scores of one page's dimension-major K block, for each key j:
//   acc[r] = 0 (r < 16); for d ascending: acc[d % 16] = fma(q[d], f16(kt[d * stride + j]), acc[d % 16])
//   scores[j] = hsum16(acc) * scale        (hsum16: kernels/quant/quant.h)
// Keys are independent lanes, so a vector op scores 16 (or 8) keys at once,
// with 16 registers of partial sums folded vertically.
//
// Weighted sum of V over keys k = 0..n-1, key k being row k % pt of page k / pt
// (pages[i] points at the head's first value in page i; rows v_stride apart):
//   acc[r] = 0 (r < 16); for k ascending: acc[k % 16] = fma(p[k], f16(v_k[d]), acc[k % 16])
//   out[d] = hsum16(acc)                   (out is overwritten)
// The keys' lanes start at k = 0, so callers start k at a multiple of 16.
#pragma once

#include <cstdint>

namespace ctx {

// Up to kMaxGroup query vectors that read one KV head go through its K and V
// together: the heads that share it (grouped-query attention), and the same
// heads of other rows over the same pages (the rows of one prompt, branches
// over their shared prefix). Each query keeps its own sums in the orders
// above, so a query gets the same bits alone or in a group, and callers may
// group however the shape suits.
constexpr int kMaxGroup = 16;

// q: g <= kMaxGroup rows of hd; kt: the KV head's K rows, hd rows of `stride`
// (= page_tokens) f16 values; scores n <= stride keys into g rows of
// `scores`, score_stride apart. (Lanes are independent: a query may be given
// keys it does not see, whose scores it then ignores.)
void attn_scores_f16(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores,
                     int score_stride);

// max of n floats (exact whatever the order).
float max_f32(const float* x, int n);

// x[i] = f32(f16(x[i] * scale)): softmax weights rounded as llama.cpp rounds
// them before they meet the f16 V.
void scale_round_f16(float* x, int n, float scale);

// The weighted sums of V for g <= kMaxGroup queries: query h (weights
// p + h * p_stride) sums its keys [0, n[h]), key k in its page pages[h][k / pt]
// (the head's first value there; rows v_stride apart), into out[h] (hd
// floats, overwritten). Pages [0, shared) are the same page for every query
// (pages[0][i]), which reads each of their V rows once for all g. hot: the
// pages are in cache (other rows of the step read them too: a prompt's), so
// the SIMD paths take them in longer runs (attention_simd.h); the same bits
// either way.
void attn_accumulate_f16(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared, int pt,
                         int v_stride, const int* n, int hd, float* const* out, bool hot);

// q8 pages (kv/page_pool.h): int8 values with one f16 scale per 32 of them.
// Each value is dequantized first, v = f16(scale) * (float)q (exact in f32:
// 11 by 8 significant bits), then the f16 kernels' orders apply unchanged:
//   scores:     acc[d % 16] = fma(q[d], f16(ks[(d / 32) * stride + j]) * (float)kq[d * stride + j], acc[d % 16])
//   accumulate: acc[k % 16] = fma(p[k] * f16(vs_k[d / 32]), (float)vq_k[d], acc[k % 16])
// (the accumulate form folds the scale into p[k]; for the f16-valued weights
// attention passes, p * scale is exact too, so this is p[k] times the
// dequantized value rounded once). hd must be a multiple of 32.
// kq: hd rows of `stride` int8, ks: hd / 32 rows of `stride` f16 scales.
void attn_scores_q8(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores, int score_stride);
// As attn_accumulate_f16, with pages[h][i] query h's int8 values in page i
// (rows v_stride apart) and scales[h][i] their f16 scales (rows s_stride apart).
void attn_accumulate_q8(const float* p, int p_stride, int g, const int8_t* const* const* pages,
                        const uint16_t* const* const* scales, int shared, int pt, int v_stride, int s_stride,
                        const int* n, int hd, float* const* out, bool hot);

namespace attn {
// Each path's kernels, one signature per kernel (the table's, kernels/kernels.h):
// a group of g queries a call; the SIMD ones take pages of 16 keys (pt unused).
#define CTX_ATTN_PATH(isa)                                                                                         \
  void scores_##isa(const float* q, int g, const uint16_t* kt, int hd, int stride, int n, float scale,             \
                    float* scores, int score_stride);                                                            \
  void scores_q8_##isa(const float* q, int g, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n,     \
                       float scale, float* scores, int score_stride);                                            \
  void accumulate_##isa(const float* p, int p_stride, int g, const uint16_t* const* const* pages, int shared,     \
                        int pt, int v_stride, const int* n, int hd, float* const* out, bool hot);                \
  void accumulate_q8_##isa(const float* p, int p_stride, int g, const int8_t* const* const* pages,                \
                           const uint16_t* const* const* scales, int shared, int pt, int v_stride, int s_stride,  \
                           const int* n, int hd, float* const* out, bool hot);                                   \
  float max_##isa(const float* x, int n);                                                                        \
  void scale_round_##isa(float* x, int n, float scale);
CTX_ATTN_PATH(scalar)
CTX_ATTN_PATH(avx2)
CTX_ATTN_PATH(avx512)
#undef CTX_ATTN_PATH
}  // namespace attn

}  // namespace ctx
