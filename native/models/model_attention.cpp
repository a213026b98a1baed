// Attention of one layer over the paged KV (kernels/attention/attention.h has the
// kernels and their orders), and the KV writes it reads back.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/activations/activations.h"
#include "kernels/attention/attention.h"
#include "kernels/prefetch.h"
#include "models/model.h"

namespace ctx {

// One layer's attention constants, shared by all its (bundle, head group) tasks.
struct Model::AttnLayer {
  int hd;
  float q_scale, scale;      // q's scale before its f16 rounding; the scores' scale
  int64_t window;            // keys visible to a row on a sliding-window layer (0: all)
  size_t k_off, ks_off, v_off, vs_off;  // this layer's arrays in a full page
  size_t shift;              // how much earlier they sit in a released page
  int hb, pt, sr;            // scale rows per head, keys a page, score row length
};

// What one row sees on this layer: keys [k0, n_kv), on its pages [p0, n_pages).
struct Model::AttnView {
  int r;                                // the row, counted from r0
  int64_t n_kv, k0, p0, n_pages;
  int64_t n_rel;                        // its sequence's released pages (never in a window)
  const std::vector<uint8_t*>* pg;      // its sequence's pages
  bool hot;                             // other rows of its sequence in the step read its pages too (attention.h)
  // Its keys in the scores, counted from its first page's first key (a bundle's rows share that page).
  int span(const AttnLayer& L) const { return static_cast<int>(n_kv - p0 * L.pt); }
  // The layer's array at `off` in page p (a released page holds it `shift` bytes earlier).
  const uint8_t* at(const AttnLayer& L, int64_t p, size_t off) const { return (*pg)[p] + (off - (p < n_rel ? L.shift : 0)); }
  // How many of the visible pages of this view and b are the same pages: all
  // of them in one sequence, a common prefix for branches (copy-on-write
  // pages); -1 where the two should not be bundled: another first page, or
  // branches that share less than three quarters of what they see.
  int64_t shared_with(const AttnLayer& L, const AttnView& b) const {
    if (p0 != b.p0) return -1;
    const int64_t n = std::min(n_pages, b.n_pages) - p0;
    if (pg == b.pg) return n;
    int64_t s = 0;
    while (s < n && at(L, p0 + s, L.k_off) == b.at(L, p0 + s, L.k_off)) ++s;
    return 4 * s >= 3 * (std::max(n_pages, b.n_pages) - p0) ? s : -1;
  }
};

// Rows that go through K and V together (attention.h): views [first,
// first + count), with one first page p0, whose first `shared` visible pages
// are the same pages for all of them.
struct Model::AttnBundle {
  int first, count;
  int64_t shared;
};

// One task's rows and heads: heads [h0, h0 + g) (sharing KV head kv_head) of
// rows [0, n_rows), whose first `shared` visible pages are the same pages.
struct Model::AttnTask {
  const AttnView* rows;
  int n_rows;
  int64_t shared;
  int kv_head, h0, g;
  // One past the last page any of its rows sees.
  int64_t end() const {
    int64_t e = 0;
    for (int m = 0; m < n_rows; ++m) e = std::max(e, rows[m].n_pages);
    return e;
  }
};

void Model::attention(int layer, const std::vector<Row>& rows, size_t r0, int n_rows,
                      const std::vector<std::vector<uint8_t*>>& pages) {
  const int hd = cfg_.head_dim;
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

  std::vector<AttnView> views(n_rows);
  for (int r = 0; r < n_rows; ++r) {
    const Row& row = rows[r0 + r];
    AttnView& v = views[r];
    v.r = r;
    // Keys [k0, pos] are visible: all of them, or the last `window` on a sliding-window layer.
    v.n_kv = row.pos + 1;
    v.k0 = at.window > 0 ? std::max<int64_t>(0, v.n_kv - at.window) : 0;
    v.p0 = v.k0 / at.pt;
    v.n_pages = (v.n_kv + at.pt - 1) / at.pt;
    v.n_rel = released_[row.item];
    v.pg = &pages[row.item];
  }
  // A sequence's rows in a step are consecutive. Where it has many (a
  // prompt's chunk), many tasks read its pages, which then stay in cache; a
  // draft's few rows go in one or two bundles, which read them from memory.
  for (int a = 0, b = 0; a < n_rows; a = b) {
    while (b < n_rows && rows[r0 + b].item == rows[r0 + a].item) ++b;
    for (int r = a; r < b; ++r) views[r].hot = b - a >= kHotRows;
  }
  const std::vector<AttnTask> tasks = attention_tasks(at, views);
  if (split_by_parts(at, views, tasks)) return attend_in_parts(at, tasks);
  pool_.parallel_for(static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const AttnTask& k = tasks[t];
      float* sc = s_.scores.data() + static_cast<size_t>(ThreadPool::thread_index()) * kMaxGroup * (at.sr + hd);
      float* q = sc + static_cast<size_t>(kMaxGroup) * at.sr;
      attend_q(at, k, q);
      attend_scores(at, k, q, sc, k.rows[0].p0, INT64_MAX);
      attend_softmax(at, k, sc);
      attend_values(at, k, sc, 0, hd);
    }
  });
}

// The heads that share a KV head, and the same heads of rows that read the
// same pages (a prompt's rows; branches over their common prefix), go
// through K and V together, up to kMaxGroup queries: each K and V row is
// read once for all of them, and a query's bits do not depend on its
// company (attention.h). Bundles stay small enough for two tasks a thread;
// with too few tasks to keep every thread busy even so (decode), heads go
// one at a time instead. A task is a bundle's heads that share a KV head.
std::vector<Model::AttnTask> Model::attention_tasks(const AttnLayer& at, const std::vector<AttnView>& views) const {
  const int n_rows = static_cast<int>(views.size()), group = cfg_.n_head / cfg_.n_head_kv;
  const int heads = std::min(group, kMaxGroup);
  const int64_t per_row = static_cast<int64_t>(cfg_.n_head_kv) * ((group + heads - 1) / heads);
  // At most 1,024 / hd queries a bundle (16 at hd 64): a longer head means
  // more register passes over a bundle's weights, which past that fall out
  // of L1 (Gemma 3, hd 256: 16 queries ran 4% slower than its 4 heads alone).
  const int most = std::max(heads, std::min(kMaxGroup, 1024 / at.hd));
  const int widest = static_cast<int>(std::clamp<int64_t>(n_rows * per_row / (2 * pool_.size()), 1, most / heads));
  // As even as the count allows: 8 rows at most 5 a bundle go as 4 + 4, not 5 + 3.
  const int n_bundles = (n_rows + widest - 1) / widest, fit = (n_rows + n_bundles - 1) / n_bundles;
  // A bundle is consecutive rows: a prompt's rows come in order, and a step's
  // branches side by side.
  std::vector<AttnBundle> bundles;
  for (int r = 0; r < n_rows; ++r) {
    if (!bundles.empty() && bundles.back().count < fit) {
      AttnBundle& last = bundles.back();
      const int64_t s = views[last.first].shared_with(at, views[r]);
      if (s >= 0) {
        last.shared = std::min(last.shared, s);
        ++last.count;
        continue;
      }
    }
    bundles.push_back({r, 1, views[r].n_pages - views[r].p0});
  }
  const int64_t n_wide = static_cast<int64_t>(bundles.size()) * per_row;
  // One sequence over a long KV keeps its heads together too, and the threads
  // split its keys (split_by_parts): by heads, each K and V line is read once a head.
  const int g_max = n_wide >= 2 * pool_.size() || lone_and_long(at, views) ? heads : 1;
  std::vector<AttnTask> tasks;
  for (const AttnBundle& b : bundles)
    for (int kv_head = 0; kv_head < cfg_.n_head_kv; ++kv_head)
      for (int h0 = kv_head * group; h0 < (kv_head + 1) * group; h0 += g_max)
        tasks.push_back({&views[b.first], b.count, b.shared, kv_head, h0, std::min(g_max, (kv_head + 1) * group - h0)});
  return tasks;
}

// Branches of one conversation decoding together (each row a sequence of its
// own, every bundle over the same shared prefix) split their attention by
// parts of the KV instead of by rows: each thread scores every row against
// its share of the pages, and sums its share of the value dimensions. So each
// core reads each line of the shared prefix once a step, where by rows each
// read all of it (a prefix of 2,000 tokens is 2 MB of K and V a layer on
// Gemma 3, as large as a core's L2). A query's bits are the same either way:
// a key's score does not depend on the others, nor a dimension's weighted sum.
bool Model::split_by_parts(const AttnLayer& at, const std::vector<AttnView>& views,
                           const std::vector<AttnTask>& tasks) const {
  if (lone_and_long(at, views)) return true;
  // Worth it where each thread would read the prefix twice or more: two or
  // more tasks a thread for each KV head.
  const size_t threads = static_cast<size_t>(pool_.size()), per_bundle = cfg_.n_head_kv;
  if (threads < 2 || tasks.size() < 2 * threads * per_bundle || views.size() > static_cast<size_t>(kMaxSplitRows))
    return false;
  // Bundles of other sequences, each sharing its first pages with the first bundle.
  const AttnView& first = *tasks[0].rows;
  int others = 0;
  for (size_t t = 1; t < tasks.size(); ++t) {
    if (tasks[t].rows == tasks[t - 1].rows) continue;
    const AttnView& v = *tasks[t].rows;
    if (v.pg == first.pg || first.shared_with(at, v) <= 0) return false;
    ++others;
  }
  return others > 0;
}

// One decoded row over kLongKeys keys or more: split by parts, each KV head's
// queries one task, it reads each K and V line once a step (one head a task, at
// 4,000 keys SmolLM2 read them three times: 62% of a token in attention).
bool Model::lone_and_long(const AttnLayer& at, const std::vector<AttnView>& views) const {
  return pool_.size() >= 2 && views.size() == 1 && (views[0].n_pages - views[0].p0) * at.pt >= kLongKeys;
}

void Model::attend_in_parts(const AttnLayer& at, const std::vector<AttnTask>& tasks) {
  const int parts = pool_.size();
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  // Every task's queries, one after another: first_q[t] is task t's first.
  std::vector<size_t> first_q(n_tasks + 1, 0);
  for (int64_t t = 0; t < n_tasks; ++t) first_q[t + 1] = first_q[t] + static_cast<size_t>(tasks[t].n_rows) * tasks[t].g;
  if (s_.split_scores.size() < first_q[n_tasks] * at.sr) s_.split_scores.resize(first_q[n_tasks] * at.sr);
  if (s_.split_q.size() < first_q[n_tasks] * at.hd) s_.split_q.resize(first_q[n_tasks] * at.hd);
  auto scores_of = [&](int64_t t) { return s_.split_scores.data() + first_q[t] * at.sr; };
  auto q_of = [&](int64_t t) { return s_.split_q.data() + first_q[t] * at.hd; };
  // Part i of n of the range [a, b), cut at multiples of `unit`.
  auto cut = [](int64_t a, int64_t b, int i, int n, int64_t unit) {
    return a + (b - a) / unit * i / n * unit + (i == n ? (b - a) % unit : 0);
  };
  for (int64_t t = 0; t < n_tasks; ++t) attend_q(at, tasks[t], q_of(t));
  // Each part scores a page for every task before the next page: a page's K
  // is read from memory once and then from L1.
  pool_.parallel_for(parts, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      thread_local std::vector<std::pair<int64_t, int64_t>> range;  // each task's pages in this part
      range.resize(n_tasks);
      int64_t first = INT64_MAX, last = 0;
      for (int64_t t = 0; t < n_tasks; ++t) {
        const AttnTask& k = tasks[t];
        range[t] = {cut(k.rows[0].p0, k.end(), i, parts, 1), cut(k.rows[0].p0, k.end(), i + 1, parts, 1)};
        first = std::min(first, range[t].first), last = std::max(last, range[t].second);
      }
      for (int64_t p = first; p < last; ++p)
        for (int64_t t = 0; t < n_tasks; ++t)
          if (range[t].first <= p && p < range[t].second) {
            if (p + kKAhead < range[t].second) prefetch_k(at, tasks[t], p + kKAhead);
            attend_scores(at, tasks[t], q_of(t), scores_of(t), p, p + 1);
          }
    }
  });
  pool_.parallel_for(n_tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) attend_softmax(at, tasks[t], scores_of(t));
  });
  // Dimensions in blocks of 32: a q8 V row's scales cover 32 values each.
  pool_.parallel_for(parts, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int d0 = static_cast<int>(cut(0, at.hd, i, parts, KV_BLOCK)),
                d1 = static_cast<int>(cut(0, at.hd, i + 1, parts, KV_BLOCK));
      if (d0 < d1)
        for (int64_t t = 0; t < n_tasks; ++t) attend_values(at, tasks[t], scores_of(t), d0, d1);
    }
  });
}

// Asks for the K block of the task's KV head in page p (of its first row) to
// be read into the cache. The pages of a long KV are far apart in memory (368
// KB on SmolLM2), each too short for the hardware to see a stream in it:
// asking two pages ahead, one sequence's decode at 4,000 keys ran 1.10x.
void Model::prefetch_k(const AttnLayer& at, const AttnTask& k, int64_t p) const {
  if (p >= k.rows[0].n_pages) return;
  const size_t bytes = static_cast<size_t>(at.hd) * at.pt * layout_.k_elem_bytes();
  const uint8_t* kb = k.rows[0].at(at, p, at.k_off) + static_cast<size_t>(k.kv_head) * bytes;
  prefetch_lines(kb, kb + bytes);
}

// A decode step of several sequences reads each one's K and V once, from
// pages far apart, as many bytes as the weights (SmolLM2, 16 sequences of
// ~180 tokens: 65 MB a step). Asked for a whole layer ahead in a burst, the
// prefetches stall the core as loads do; asked for one line a block of
// weights by the rows kernels of the matmuls just before the layer's
// attention (kernels/prefetch.h ReadAhead), they are read while the
// arithmetic runs. This lists the blocks, at most kAheadBytes of them (a few
// times a core's L2); pages that branches share are listed once.
void Model::plan_kv_ahead(int layer, const std::vector<Row>& rows, size_t r0, int n,
                          const std::vector<std::vector<uint8_t*>>& pages) {
  kv_ahead_.clear();
  kv_ahead_next_.store(0, std::memory_order_relaxed);
  if (layer >= cfg_.n_layer || n < kAheadMinRows || n > kAheadMaxRows) return;
  const PageLayout& lay = layout_;
  const size_t bytes = lay.layer_bytes(), off = lay.k_offset(layer);
  const int64_t window = cfg_.is_swa(layer) ? cfg_.swa_window : 0, pt = lay.page_tokens;
  const size_t shift = kept_index_[layer] >= 0 ? static_cast<size_t>(layer - kept_index_[layer]) * bytes : 0;
  const std::vector<uint8_t*>* prev = nullptr;  // the last item listed
  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r0 + r];
    if (r + 1 < n && rows[r0 + r + 1].item == row.item) continue;  // an item's last row sees the most
    const std::vector<uint8_t*>& pg = pages[row.item];
    const int64_t n_kv = row.pos + 1, k0 = window > 0 ? std::max<int64_t>(0, n_kv - window) : 0;
    const int64_t rel = released_[row.item];
    for (int64_t p = k0 / pt; p < (n_kv + pt - 1) / pt; ++p) {
      if (prev && p < static_cast<int64_t>(prev->size()) && (*prev)[p] == pg[p]) continue;  // shared with the last
      if ((kv_ahead_.size() + 1) * bytes > kAheadBytes) return;
      kv_ahead_.push_back({pg[p] + off - (p < rel ? shift : 0), bytes});
    }
    prev = &pg;
  }
}

// Heads [h0, h0 + g) (sharing KV head kv_head) of each of the task's rows
// over the keys each sees: scores, softmax, the weighted sum of V into s_.att.
// Query m * g + h is row m's head h0 + h; sc holds its scores at row
// (m * g + h) of at.sr, sc[j] scoring key p0 * pt + j.
//
// The task's queries, rounded to f16 into q. Q and the softmax weights are
// rounded to f16 before they meet the f16 K and V, as llama.cpp's
// (non-flash) attention does: its logits are the reference we are held to,
// and the rounding moves them measurably.
void Model::attend_q(const AttnLayer& at, const AttnTask& k, float* q) {
  const int hd = at.hd, g = k.g;
  for (int m = 0; m < k.n_rows; ++m) {
    const float* q32 = s_.q.data() + static_cast<size_t>(k.rows[m].r) * cfg_.q_dim() + k.h0 * hd;
    std::copy(q32, q32 + g * hd, q + static_cast<size_t>(m) * g * hd);
  }
  scale_round_f16(q, k.n_rows * g * hd, at.q_scale);
}

// The scores of pages [pa, pb) (of those the task's rows see) for the
// queries q (attend_q).
void Model::attend_scores(const AttnLayer& at, const AttnTask& k, const float* q, float* sc, int64_t pa, int64_t pb) {
  const int hd = at.hd, pt = at.pt, sr = at.sr, hb = at.hb, g = k.g, nq = k.n_rows * g;
  const AttnView* rows = k.rows;
  const PageLayout& lay = layout_;
  // A shared page is scored once for every query, up to the last key any of
  // them sees; each row's own pages alone.
  const int64_t p0 = rows[0].p0, n_pages = k.end();
  auto score = [&](const AttnView& v, int64_t p, const float* qs, int nqs, int n, float* out) {
    if (lay.k_quantized()) {
      const int8_t* kq = reinterpret_cast<const int8_t*>(v.at(at, p, at.k_off)) + static_cast<size_t>(k.kv_head) * hd * pt;
      const uint16_t* ks =
          reinterpret_cast<const uint16_t*>(v.at(at, p, at.ks_off)) + static_cast<size_t>(k.kv_head) * hb * pt;
      attn_scores_q8(qs, nqs, kq, ks, hd, pt, n, at.scale, out, sr);
    } else {
      const uint16_t* kt =
          reinterpret_cast<const uint16_t*>(v.at(at, p, at.k_off)) + static_cast<size_t>(k.kv_head) * hd * pt;
      attn_scores_f16(qs, nqs, kt, hd, pt, n, at.scale, out, sr);
    }
  };
  auto keys_in = [&](const AttnView& v, int64_t p) { return static_cast<int>(std::min<int64_t>(pt, v.n_kv - p * pt)); };
  for (int64_t p = std::max(pa, p0); p < std::min(pb, n_pages); ++p) {
    if (p - p0 < k.shared) {
      int n = 0;
      for (int m = 0; m < k.n_rows; ++m) n = std::max(n, keys_in(rows[m], p));
      score(rows[0], p, q, nq, n, sc + (p - p0) * pt);
    } else {
      for (int m = 0; m < k.n_rows; ++m)
        if (p < rows[m].n_pages)
          score(rows[m], p, q + static_cast<size_t>(m) * g * hd, g, keys_in(rows[m], p),
                sc + static_cast<size_t>(m) * g * sr + (p - p0) * pt);
    }
  }
}

// Softmax over each row's visible keys, as llama.cpp computes it: the masked
// head of the first page is -inf (weight 0) so the sum's chunks of 16 stay
// aligned with the pages; the sum is a double.
void Model::attend_softmax(const AttnLayer& at, const AttnTask& k, float* sc) {
  for (int m = 0; m < k.n_rows; ++m) {
    const AttnView& v = k.rows[m];
    const int skip = static_cast<int>(v.k0 - v.p0 * at.pt), n_span = v.span(at);
    for (int h = 0; h < k.g; ++h) {
      float* s = sc + static_cast<size_t>(m * k.g + h) * at.sr;
      std::fill(s, s + skip, -INFINITY);
      const float mx = max_f32(s + skip, n_span - skip);
      const double sum = exp_shift_sum(s, n_span, mx);
      scale_round_f16(s, n_span, static_cast<float>(1.0 / sum));
    }
  }
}

// Dimensions [d0, d1) of each query's weighted sum of V (d0, d1 multiples of 32).
void Model::attend_values(const AttnLayer& at, const AttnTask& k, const float* sc, int d0, int d1) {
  const int hd = d1 - d0, pt = at.pt, g = k.g, nq = k.n_rows * g;
  const AttnView* rows = k.rows;
  const PageLayout& lay = layout_;
  int spans[kMaxGroup];
  float* outs[kMaxGroup];
  for (int m = 0; m < k.n_rows; ++m)
    for (int h = 0; h < g; ++h) {
      spans[m * g + h] = rows[m].span(at);
      outs[m * g + h] = s_.att.data() + static_cast<size_t>(rows[m].r) * cfg_.q_dim() + (k.h0 + h) * at.hd + d0;
    }
  // Per thread, each row's V blocks of its visible pages (grown once, reused);
  // query m * g + h reads row m's.
  thread_local std::vector<const uint16_t*> v16, v_scales;
  thread_local std::vector<const int8_t*> v8;
  const int64_t p0 = rows[0].p0, n_pages = k.end();
  const size_t n_vis = static_cast<size_t>(n_pages - p0), v_head = static_cast<size_t>(k.kv_head) * at.hd + d0,
               s_head = static_cast<size_t>(k.kv_head) * at.hb + d0 / KV_BLOCK;
  const int s = static_cast<int>(k.shared);
  if (lay.v_quantized()) {
    v8.resize(k.n_rows * n_vis);
    v_scales.resize(k.n_rows * n_vis);
    const int8_t* const* l8[kMaxGroup];
    const uint16_t* const* ls[kMaxGroup];
    for (int m = 0; m < k.n_rows; ++m) {
      for (int64_t p = p0; p < rows[m].n_pages; ++p) {
        v8[m * n_vis + p - p0] = reinterpret_cast<const int8_t*>(rows[m].at(at, p, at.v_off)) + v_head;
        v_scales[m * n_vis + p - p0] = reinterpret_cast<const uint16_t*>(rows[m].at(at, p, at.vs_off)) + s_head;
      }
      std::fill(l8 + m * g, l8 + (m + 1) * g, &v8[m * n_vis]);
      std::fill(ls + m * g, ls + (m + 1) * g, &v_scales[m * n_vis]);
    }
    attn_accumulate_q8(sc, at.sr, nq, l8, ls, s, pt, cfg_.kv_dim(), lay.n_blocks(), spans, hd, outs, rows[0].hot);
  } else {
    v16.resize(k.n_rows * n_vis);
    const uint16_t* const* l16[kMaxGroup];
    for (int m = 0; m < k.n_rows; ++m) {
      for (int64_t p = p0; p < rows[m].n_pages; ++p)
        v16[m * n_vis + p - p0] = reinterpret_cast<const uint16_t*>(rows[m].at(at, p, at.v_off)) + v_head;
      std::fill(l16 + m * g, l16 + (m + 1) * g, &v16[m * n_vis]);
    }
    attn_accumulate_f16(sc, at.sr, nq, l16, s, pt, cfg_.kv_dim(), spans, hd, outs, rows[0].hot);
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
