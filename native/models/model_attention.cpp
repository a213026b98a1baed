// Attention of one layer over the paged KV (kernels/attention/attention.h has the
// kernels and their orders), and the KV writes it reads back.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/activations/activations.h"
#include "kernels/attention/attention.h"
#include "models/model.h"

namespace ctx {

// One layer's attention constants, shared by all its (row, head group) tasks.
struct Model::AttnLayer {
  int hd;
  float q_scale, scale;      // q's scale before its f16 rounding; the scores' scale
  int64_t window;            // keys visible to a row on a sliding-window layer (0: all)
  size_t k_off, ks_off, v_off, vs_off;  // this layer's arrays in a full page
  size_t shift;              // how much earlier they sit in a released page
  int hb, pt, sr;            // scale rows per head, keys a page, score row length
};

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
  const PageLayout& lay = layout_;
  AttnLayer at;
  at.hd = hd;
  // gemma scales q before attention (attn_scale, before its f16 rounding, as
  // llama.cpp's graph does); the llama family scales the scores.
  at.q_scale = cfg_.attn_scale > 0.0f ? cfg_.attn_scale : 1.0f;
  at.scale = cfg_.attn_scale > 0.0f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(hd));
  at.window = cfg_.is_swa(layer) ? cfg_.swa_window : 0;
  at.k_off = lay.k_offset(layer);
  at.ks_off = lay.k_scale_offset(layer);
  at.v_off = lay.v_offset(layer, 0);
  at.vs_off = lay.v_scale_offset(layer, 0);
  // A released page (kv/page_pool.h SwaRelease) holds only the full-attention
  // layers, this one at index kept_index_[layer]: its arrays sit `shift`
  // bytes earlier than in a full page.
  at.shift = kept_index_[layer] >= 0 ? static_cast<size_t>(layer - kept_index_[layer]) * lay.layer_bytes() : 0;
  at.hb = hd / KV_BLOCK;
  at.pt = lay.page_tokens;
  at.sr = s_.score_row;

  pool_.parallel_for(static_cast<int64_t>(n_rows) * cfg_.n_head_kv * per_kv, 2, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int r = static_cast<int>(t / (cfg_.n_head_kv * per_kv));
      const int kv_head = static_cast<int>(t / per_kv % cfg_.n_head_kv);
      const int h0 = kv_head * group + static_cast<int>(t % per_kv) * g_max;
      const Row& row = rows[r0 + r];
      attend(at, row, pages[row.item], r, kv_head, h0, std::min(g_max, (kv_head + 1) * group - h0));
    }
  });
}

// Heads [h0, h0 + g) of row r (sharing KV head kv_head) over the row's
// visible keys: scores, softmax, the weighted sum of V into s_.att.
void Model::attend(const AttnLayer& at, const Row& row, const std::vector<uint8_t*>& pg, int r, int kv_head, int h0,
                   int g) {
  const int hd = at.hd, pt = at.pt, sr = at.sr, hb = at.hb;
  const PageLayout& lay = layout_;
  // This thread's scratch: kMaxGroup rows of scores, then the group's q.
  float* sc = s_.scores.data() + static_cast<size_t>(ThreadPool::thread_index()) * kMaxGroup * (sr + hd);
  float* q = sc + static_cast<size_t>(kMaxGroup) * sr;
  // Q and the softmax weights are rounded to f16 before they meet the f16
  // K and V, as llama.cpp's (non-flash) attention does: its logits are
  // the reference we are held to, and the rounding moves them measurably.
  const float* q32 = s_.q.data() + static_cast<size_t>(r) * cfg_.q_dim() + h0 * hd;
  std::copy(q32, q32 + g * hd, q);
  scale_round_f16(q, g * hd, at.q_scale);
  // Keys [k0, pos] are visible: all of them, or the last `window` on a
  // sliding-window layer. Pages p0.. hold them; sc[j] scores key p0 * pt + j.
  const int64_t n_kv = row.pos + 1;
  const int64_t k0 = at.window > 0 ? std::max<int64_t>(0, n_kv - at.window) : 0;
  const int64_t p0 = k0 / pt, n_pages = (n_kv + pt - 1) / pt;
  const int64_t n_rel = released_[row.item];  // pages [0, n_rel) are released; never in a window
  auto page = [&](int64_t p, size_t off) { return pg[p] + (off - (p < n_rel ? at.shift : 0)); };
  for (int64_t p = p0; p < n_pages; ++p) {
    const int n = static_cast<int>(std::min<int64_t>(pt, n_kv - p * pt));
    float* out = sc + (p - p0) * pt;
    if (lay.k_quantized()) {
      const int8_t* kq = reinterpret_cast<const int8_t*>(page(p, at.k_off)) + static_cast<size_t>(kv_head) * hd * pt;
      const uint16_t* ks = reinterpret_cast<const uint16_t*>(page(p, at.ks_off)) + static_cast<size_t>(kv_head) * hb * pt;
      attn_scores_q8(q, g, kq, ks, hd, pt, n, at.scale, out, sr);
    } else {
      const uint16_t* kt = reinterpret_cast<const uint16_t*>(page(p, at.k_off)) + static_cast<size_t>(kv_head) * hd * pt;
      attn_scores_f16(q, g, kt, hd, pt, n, at.scale, out, sr);
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
  // Per thread, the V blocks of the visible pages (grown once, reused).
  thread_local std::vector<const uint16_t*> v16, v_scales;
  thread_local std::vector<const int8_t*> v8;
  const size_t n_vis = static_cast<size_t>(n_pages - p0);
  float* out = s_.att.data() + static_cast<size_t>(r) * cfg_.q_dim() + h0 * hd;
  if (lay.v_quantized()) {
    v8.resize(n_vis);
    v_scales.resize(n_vis);
    for (int64_t p = p0; p < n_pages; ++p) {
      v8[p - p0] = reinterpret_cast<const int8_t*>(page(p, at.v_off)) + static_cast<size_t>(kv_head) * hd;
      v_scales[p - p0] = reinterpret_cast<const uint16_t*>(page(p, at.vs_off)) + static_cast<size_t>(kv_head) * hb;
    }
    attn_accumulate_q8(sc, sr, g, v8.data(), v_scales.data(), pt, cfg_.kv_dim(), lay.n_blocks(), n_span, hd, out);
  } else {
    v16.resize(n_vis);
    for (int64_t p = p0; p < n_pages; ++p)
      v16[p - p0] = reinterpret_cast<const uint16_t*>(page(p, at.v_off)) + static_cast<size_t>(kv_head) * hd;
    attn_accumulate_f16(sc, sr, g, v16.data(), pt, cfg_.kv_dim(), n_span, hd, out);
  }
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
