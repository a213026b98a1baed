// Attention of one layer over the paged KV (models/attention.h has the
// kernels and their orders), and the KV writes it reads back.
#include <algorithm>
#include <cmath>
#include <vector>

#include "models/activations.h"
#include "models/attention.h"
#include "models/model.h"

namespace ctx {

void Model::attention(int layer, const std::vector<Row>& rows, size_t r0, int n_rows,
                      const std::vector<std::vector<uint8_t*>>& pages) {
  const int hd = cfg_.head_dim;
  const int group = cfg_.n_head / cfg_.n_head_kv;
  // The heads that share a KV head are scored in groups of up to kMaxGroup,
  // which reads each K and V row once for the group; a head's bits do not
  // depend on its group (attention.h). With too few groups to keep every
  // thread busy (decode), heads go one at a time instead.
  const int64_t n_groups_wide = static_cast<int64_t>(n_rows) * cfg_.n_head_kv * ((group + kMaxGroup - 1) / kMaxGroup);
  const int g_max = n_groups_wide >= 2 * pool_.size() ? std::min(group, kMaxGroup) : 1;
  const int per_kv = (group + g_max - 1) / g_max;  // tasks per (row, KV head)
  // gemma scales q before attention (attn_scale, before its f16 rounding, as
  // llama.cpp's graph does); the llama family scales the scores.
  const float q_scale = cfg_.attn_scale > 0.0f ? cfg_.attn_scale : 1.0f;
  const float scale = cfg_.attn_scale > 0.0f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t window = cfg_.is_swa(layer) ? cfg_.swa_window : 0;
  const PageLayout& lay = layout_;
  const size_t k_off = lay.k_offset(layer), ks_off = lay.k_scale_offset(layer);
  const size_t v_off = lay.v_offset(layer, 0), vs_off = lay.v_scale_offset(layer, 0);
  // A released page (kv/page_pool.h SwaRelease) holds only the full-attention
  // layers, this one at index kept_index_[layer]: its arrays sit `shift`
  // bytes earlier than in a full page.
  const size_t shift = kept_index_[layer] >= 0 ? static_cast<size_t>(layer - kept_index_[layer]) * lay.layer_bytes() : 0;
  const int hb = hd / KV_BLOCK;  // scale rows per head (quantized sides only)
  const int pt = lay.page_tokens;
  const int sr = s_.score_row;

  pool_.parallel_for(static_cast<int64_t>(n_rows) * cfg_.n_head_kv * per_kv, 2, [&](int64_t t0, int64_t t1) {
    // This thread's scratch: kMaxGroup rows of scores, then the group's q.
    float* sc = s_.scores.data() + static_cast<size_t>(ThreadPool::thread_index()) * kMaxGroup * (sr + hd);
    float* q = sc + static_cast<size_t>(kMaxGroup) * sr;
    // Per thread, the V blocks of the visible pages (grown once, reused).
    thread_local std::vector<const uint16_t*> v16, v_scales;
    thread_local std::vector<const int8_t*> v8;
    for (int64_t t = t0; t < t1; ++t) {
      const int r = static_cast<int>(t / (cfg_.n_head_kv * per_kv));
      const int kv_head = static_cast<int>(t / per_kv % cfg_.n_head_kv);
      const int h0 = kv_head * group + static_cast<int>(t % per_kv) * g_max;
      const int g = std::min(g_max, (kv_head + 1) * group - h0);
      const Row& row = rows[r0 + r];
      const std::vector<uint8_t*>& pg = pages[row.item];
      // Q and the softmax weights are rounded to f16 before they meet the f16
      // K and V, as llama.cpp's (non-flash) attention does: its logits are
      // the reference we are held to, and the rounding moves them measurably.
      const float* q32 = s_.q.data() + static_cast<size_t>(r) * cfg_.q_dim() + h0 * hd;
      std::copy(q32, q32 + g * hd, q);
      scale_round_f16(q, g * hd, q_scale);
      // Keys [k0, pos] are visible: all of them, or the last `window` on a
      // sliding-window layer. Pages p0.. hold them; sc[j] scores key p0 * pt + j.
      const int64_t n_kv = row.pos + 1;
      const int64_t k0 = window > 0 ? std::max<int64_t>(0, n_kv - window) : 0;
      const int64_t p0 = k0 / pt, n_pages = (n_kv + pt - 1) / pt;
      const int64_t n_rel = released_[row.item];  // pages [0, n_rel) are released; never in a window
      for (int64_t p = p0; p < n_pages; ++p) {
        const int n = static_cast<int>(std::min<int64_t>(pt, n_kv - p * pt));
        float* out = sc + (p - p0) * pt;
        const size_t adj = p < n_rel ? shift : 0;  // sliding-window layers never reach a released page
        if (lay.k_quantized()) {
          const int8_t* kq = reinterpret_cast<const int8_t*>(pg[p] + (k_off - adj)) + static_cast<size_t>(kv_head) * hd * pt;
          const uint16_t* ks =
              reinterpret_cast<const uint16_t*>(pg[p] + (ks_off - adj)) + static_cast<size_t>(kv_head) * hb * pt;
          attn_scores_q8(q, g, kq, ks, hd, pt, n, scale, out, sr);
        } else {
          const uint16_t* kt =
              reinterpret_cast<const uint16_t*>(pg[p] + (k_off - adj)) + static_cast<size_t>(kv_head) * hd * pt;
          attn_scores_f16(q, g, kt, hd, pt, n, scale, out, sr);
        }
      }
      // Softmax over the visible keys, as llama.cpp computes it: the masked
      // head of the first page is -inf (weight 0) so the sum's chunks of 16
      // stay aligned with the pages; the sum is a double.
      const int skip = static_cast<int>(k0 - p0 * pt);
      const int n_span = static_cast<int>(n_kv - p0 * pt);
      for (int h = 0; h < g; ++h) {
        float* s = sc + static_cast<size_t>(h) * sr;
        std::fill(s, s + skip, -INFINITY);
        const float mx = max_f32(s + skip, n_span - skip);
        const double sum = exp_shift_sum(s, n_span, mx);
        scale_round_f16(s, n_span, static_cast<float>(1.0 / sum));
      }
      const size_t n_vis_pages = static_cast<size_t>(n_pages - p0);
      float* out = s_.att.data() + static_cast<size_t>(r) * cfg_.q_dim() + h0 * hd;
      if (lay.v_quantized()) {
        v8.resize(n_vis_pages);
        v_scales.resize(n_vis_pages);
        for (int64_t p = p0; p < n_pages; ++p) {
          const size_t adj = p < n_rel ? shift : 0;
          v8[p - p0] = reinterpret_cast<const int8_t*>(pg[p] + (v_off - adj)) + static_cast<size_t>(kv_head) * hd;
          v_scales[p - p0] = reinterpret_cast<const uint16_t*>(pg[p] + (vs_off - adj)) + static_cast<size_t>(kv_head) * hb;
        }
        attn_accumulate_q8(sc, sr, g, v8.data(), v_scales.data(), pt, cfg_.kv_dim(), lay.n_blocks(), n_span, hd, out);
      } else {
        v16.resize(n_vis_pages);
        for (int64_t p = p0; p < n_pages; ++p) {
          const size_t adj = p < n_rel ? shift : 0;
          v16[p - p0] = reinterpret_cast<const uint16_t*>(pg[p] + (v_off - adj)) + static_cast<size_t>(kv_head) * hd;
        }
        attn_accumulate_f16(sc, sr, g, v16.data(), pt, cfg_.kv_dim(), n_span, hd, out);
      }
    }
  });
}

void Model::write_kv(int layer, int r, uint8_t* page, int slot) {
  const PageLayout& lay = layout_;
  const int KD = cfg_.kv_dim(), pt = lay.page_tokens;
  const float* k = &s_.k[static_cast<size_t>(r) * KD];
  const float* v = &s_.v[static_cast<size_t>(r) * KD];
  uint8_t* k_base = page + lay.k_offset(layer);
  // One K row before it is scattered into the page's dimension-major block
  // (per thread: rows are written in parallel).
  thread_local std::vector<uint16_t> k16;  // (kv_dim) f16
  thread_local std::vector<int8_t> k8;     // (kv_dim) int8 (q8 pages)
  thread_local std::vector<uint16_t> k8d;  // (kv_dim / 32) its f16 scales
  if (lay.k_quantized()) {
    k8.resize(KD);
    k8d.resize(KD / KV_BLOCK);  // scatter into the dimension-major int8 K and its scale rows
    quantize_row_kv8(k, k8.data(), k8d.data(), KD);
    int8_t* kq = reinterpret_cast<int8_t*>(k_base);
    uint16_t* ks = reinterpret_cast<uint16_t*>(page + lay.k_scale_offset(layer));
    for (int e = 0; e < KD; ++e) kq[static_cast<size_t>(e) * pt + slot] = k8[e];
    for (int b = 0; b < lay.n_blocks(); ++b) ks[static_cast<size_t>(b) * pt + slot] = k8d[b];
  } else {
    uint16_t* kt = reinterpret_cast<uint16_t*>(k_base);
    k16.resize(KD);
    f32_to_f16_row(k, k16.data(), KD);
    for (int e = 0; e < KD; ++e) kt[static_cast<size_t>(e) * pt + slot] = k16[e];
  }
  uint8_t* v_row = page + lay.v_offset(layer, slot);
  if (lay.v_quantized())
    quantize_row_kv8(v, reinterpret_cast<int8_t*>(v_row),
                     reinterpret_cast<uint16_t*>(page + lay.v_scale_offset(layer, slot)), KD);
  else
    f32_to_f16_row(v, reinterpret_cast<uint16_t*>(v_row), KD);
}

}  // namespace ctx
