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

// max of n floats (exact whatever the order).
float max_f32(const float* x, int n);

// x[i] = f32(f16(x[i] * scale)): softmax weights rounded as llama.cpp rounds
// them before they meet the f16 V.
void scale_round_f16(float* x, int n, float scale);

// out[d] = fma(p[j], f16(v[j * v_stride + d]), out[d]) for j = 0..n-1 ascending,
// for every d < hd: the weighted sum of one page's V rows, kept in registers.
void attn_accumulate_f16(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out);

// q8 pages (kv/page_pool.h): int8 values with one f16 scale per 32 of them.
// Each value is dequantized first, v = f16(scale) * (float)q (exact in f32:
// 11 by 8 significant bits), then the f16 kernels' orders apply unchanged:
//   scores:     acc = fma(q[d], f16(ks[(d / 32) * stride + j]) * (float)kq[d * stride + j], acc)
//   accumulate: out[d] = fma(p[j] * f16(vs[j * s_stride + d / 32]), (float)vq[j * v_stride + d], out[d])
// (the accumulate form folds the scale into p[j]; for the f16-valued weights
// attention passes, p * scale is exact too, so this is p[j] times the
// dequantized value rounded once). hd must be a multiple of 32.
// kq: hd rows of `stride` int8, ks: hd / 32 rows of `stride` f16 scales.
void attn_scores_q8(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores);
// vq: n rows of v_stride int8 (the head's hd values first); vs: n rows of s_stride f16 scales.
void attn_accumulate_q8(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride, int n,
                        int hd, float* out);

namespace attn {
float max_avx512(const float* x, int n);
void scale_round_avx512(float* x, int n, float scale);
void accumulate_avx512(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out);
float max_avx2(const float* x, int n);
void scale_round_avx2(float* x, int n, float scale);
void accumulate_avx2(const float* p, const uint16_t* v, int v_stride, int n, int hd, float* out);
void scores_avx2(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores);
void scores_avx512(const float* q, const uint16_t* kt, int hd, int stride, int n, float scale, float* scores);
void scores_q8_avx2(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                    float* scores);
void scores_q8_avx512(const float* q, const int8_t* kq, const uint16_t* ks, int hd, int stride, int n, float scale,
                      float* scores);
void accumulate_q8_avx2(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride, int n,
                        int hd, float* out);
void accumulate_q8_avx512(const float* p, const int8_t* vq, int v_stride, const uint16_t* vs, int s_stride, int n,
                          int hd, float* out);
}  // namespace attn

}  // namespace ctx
