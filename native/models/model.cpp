// The llama-family forward pass: llama, mistral-style and SmolLM2, plus qwen2
// (q/k/v biases), qwen3 (per-head q/k RMS norms) and gemma3 (scaled
// embeddings, post-attention and post-FFN norms, GeGLU, sliding-window
// layers with their own RoPE base), selected by the config and by which
// weights are present.
//
// Determinism: every output element is computed whole by one thread with a
// fixed reduction order (kernels/quant/quant.h), rows never interact except through
// the KV they have written, and attention reads K/V back from the pages, f16
// or 8-bit (also for positions written in this very step). So a token's
// logits do not depend on the thread count, on how the prompt was chunked, or
// on which other sequences share the step.
#include "models/model.h"

#include "kernels/activations/activations.h"
#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx {

namespace {

// Chunk of token rows processed together: big enough that each weight row is
// reused across many activation rows (prefill is compute-bound) and the
// prefill tiles' weight unpacking is paid once per chunk, small enough that a
// chunk's activations stay in L2. (Gemma 3 pp512, machine B under load: 64
// rows 930 tok/s, 128 rows 1,150, 256 rows 1,050; machine F, quiet, the two
// alternated in one process: 256 rows 1.04x 128 on Gemma 3 and 1.05x on
// SmolLM2, 1.01-1.02x at pp2048.) Results do not depend on it.
constexpr int kMaxRows = 256;

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) { rmsnorm_rows(x, w, out, 1, n, eps); }

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

Model::Model(ModelConfig config, ModelWeights weights, int n_threads)
    : cfg_(std::move(config)), w_(std::move(weights)), pool_(n_threads) {
  if (cfg_.n_layer <= 0 || cfg_.n_embd <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 ||
      cfg_.head_dim <= 0 || cfg_.n_ff <= 0 || cfg_.n_vocab <= 0)
    throw std::invalid_argument("model config has a non-positive dimension");
  if (cfg_.n_head % cfg_.n_head_kv != 0)
    throw std::invalid_argument("n_head must be a multiple of n_head_kv");
  if (cfg_.rope_dim <= 0 || cfg_.rope_dim > cfg_.head_dim || cfg_.rope_dim % 2 != 0)
    throw std::invalid_argument("rope dimension must be even and at most head_dim");
  if (static_cast<int>(w_.layers.size()) != cfg_.n_layer)
    throw std::invalid_argument("layer count does not match the config");
  if (!cfg_.swa_layer.empty() && static_cast<int>(cfg_.swa_layer.size()) != cfg_.n_layer)
    throw std::invalid_argument("sliding-window layer pattern does not cover every layer");
  if (cfg_.swa_window < 0) throw std::invalid_argument("sliding window must not be negative");
  kept_index_.assign(cfg_.n_layer, -1);
  for (int l = 0, k = 0; l < cfg_.n_layer; ++l)
    if (!cfg_.is_swa(l)) kept_index_[l] = cfg_.swa_window > 0 ? k++ : -1;
  theta_scale_ = std::pow(cfg_.rope_base, -2.0f / static_cast<float>(cfg_.rope_dim));
  theta_scale_swa_ = std::pow(cfg_.rope_base_swa, -2.0f / static_cast<float>(cfg_.rope_dim));
  repack_weights();
}

// Decode reads every weight for each token, from memory: products of one or
// two rows (a sequence's step; two streams, a draft of one) read the copies,
// in address order (quant.h repack_x8). The copies cost their size in
// memory, so they are made within cfg_.repack_budget bytes, the output
// matrix first (Gemma 3 270M's Q8_0 output alone is 178 MB of the
// 247 a token reads: decode 1.31x; its layers' 45 MB added 1.5%, SmolLM2's
// 66 MB 8%; Zen 4, docs/PERFORMANCE.md), then the layers' matrices in order.
// The file's rows stay for the embedding lookups and for products of more
// rows (prompts, longer drafts, batched decode), whose kernels are bound by
// arithmetic more than by the reading.
void Model::repack_weights() {
  std::vector<Weight*> ws{&w_.output};
  for (LayerWeights& L : w_.layers)
    for (Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) ws.push_back(w);
  for (Weight* w : ws) {
    if (!dtype_has_x8(w->type) || w->n_in < QK || w->n_out <= 0 || w->data == nullptr) continue;
    const size_t bytes = x8_bytes(w->type, w->n_in, w->n_out);
    if (repacked_bytes_ + bytes > cfg_.repack_budget) continue;
    x8_.emplace_back(new uint8_t[bytes]);
    uint8_t* dst = x8_.back().get();
    pool_.parallel_for((w->n_out + 7) / 8, 64, [&](int64_t g0, int64_t g1) {
      repack_x8(w->type, w->data, w->n_in, w->n_out, static_cast<int>(g0), static_cast<int>(g1), dst);
    });
    w->x8 = dst;
    repacked_bytes_ += bytes;
  }
}

static_assert(KV_BLOCK == QK, "q8 KV pages use quantize_row_kv8's blocks");

PageLayout Model::page_layout(int page_tokens, KVDType dtype) const {
  if (page_tokens < 1) throw std::invalid_argument("pages need at least one token");
  if (dtype != KVDType::f16 && cfg_.head_dim % KV_BLOCK != 0)
    throw std::invalid_argument(std::string("a ") + kv_dtype_name(dtype) + " KV needs a head size that is a multiple of " +
                                std::to_string(KV_BLOCK) + "; this model's is " + std::to_string(cfg_.head_dim));
  PageLayout lay;
  lay.n_layer = cfg_.n_layer;
  lay.page_tokens = page_tokens;
  lay.kv_dim = cfg_.kv_dim();
  lay.dtype = dtype;
  return lay;
}

void Model::ensure_scratch(int rows) {
  if (rows <= scratch_rows_) return;
  const size_t r = static_cast<size_t>(rows);
  const int max_in = std::max({cfg_.n_embd, cfg_.n_ff, cfg_.q_dim()});
  s_.x.assign(r * cfg_.n_embd, 0.0f);
  s_.xb.assign(r * cfg_.n_embd, 0.0f);
  s_.xq.assign(r * (round_up(max_in, QK) / QK), BlockQ8A{});
  s_.xk.assign(r * (round_up(max_in, QK_K) / QK_K), BlockQ8K{});
  s_.q.assign(r * cfg_.q_dim(), 0.0f);
  s_.k.assign(r * cfg_.kv_dim(), 0.0f);
  s_.v.assign(r * cfg_.kv_dim(), 0.0f);
  s_.att.assign(r * cfg_.q_dim(), 0.0f);
  s_.hb.assign(r * cfg_.n_ff, 0.0f);
  s_.hb2.assign(r * cfg_.n_ff, 0.0f);
  s_.rope.assign(r * cfg_.rope_dim, 0.0f);
  s_.rope_swa.assign(cfg_.swa_window > 0 ? r * cfg_.rope_dim : 0, 0.0f);
  s_.xlog.assign(r * cfg_.n_embd, 0.0f);
  scratch_rows_ = rows;
}

void Model::quantize_rows(const float* x, int n_rows, int n_in, ActFormat format) {
  if (format == ActFormat::q8a) xq_id_ = new_activation_id();  // new rows: what the kernels kept of the last is stale
  pool_.parallel_for(n_rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (format == ActFormat::q8k)
        quantize_row_q8k(x + r * n_in, s_.xk.data() + r * (n_in / QK_K), n_in);
      else
        quantize_row_q8a(x + r * n_in, s_.xq.data() + r * (n_in / QK), n_in);
    }
  });
}

// x's rows rounded to f16 (F16) or bf16 (BF16) into y, row by row across the
// pool (each value on its own: the same bits however the rows are split).
static void round_rows(ThreadPool& pool, DType t, const float* x, float* y, int n_rows, int n_in) {
  pool.parallel_for(n_rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      (t == DType::F16 ? round_row_f16 : round_row_bf16)(x + r * n_in, y + r * n_in, n_in);
  });
}

// y_j (n_rows, w_j.n_out) = x (n_rows, n_in) . W_j^T for every job j, split
// across the output rows of all jobs together. Quantized weights share one
// quantization of x per activation format (Q8A, Q8K); F16 and BF16 weights
// one rounding of x to their type (llama.cpp converts a matmul's activations
// to F16 / BF16 for them, quant.h round_row_f16), made before the jobs split.
// Adapters (lora_down) take x as it is.
void Model::matmul(std::initializer_list<MatmulJob> jobs, const float* x, int n_rows, int layer, bool read_ahead) {
  int n_in = -1;
  bool need_q8a = false, need_q8k = false, need_f16 = false, need_bf16 = false;
  int64_t total = 0;
  for (const MatmulJob& j : jobs) {
    if (n_in >= 0 && j.w->n_in != n_in) throw std::logic_error("fused matmuls need the same input size");
    n_in = j.w->n_in;
    need_q8a |= dtype_is_quantized(j.w->type);
    need_q8k |= dtype_is_kquant(j.w->type);
    need_f16 |= j.w->type == DType::F16;
    need_bf16 |= j.w->type == DType::BF16;
    total += j.w->n_out;
  }
  if (need_q8a) quantize_rows(x, n_rows, n_in, ActFormat::q8a);
  if (need_q8k) quantize_rows(x, n_rows, n_in, ActFormat::q8k);
  float* x_f16 = nullptr;
  float* x_bf16 = nullptr;
  if (need_f16 || need_bf16) {
    const size_t xn = static_cast<size_t>(n_rows) * static_cast<size_t>(n_in);
    if (s_.xr.size() < 2 * xn) s_.xr.resize(2 * xn);
    x_f16 = s_.xr.data(), x_bf16 = s_.xr.data() + xn;
    if (need_f16) round_rows(pool_, DType::F16, x, x_f16, n_rows, n_in);
    if (need_bf16) round_rows(pool_, DType::BF16, x, x_bf16, n_rows, n_in);
  }
  // The adapters' A x tasks come first, kTile units each, so that every one is
  // claimed before any chunk of output rows (model_lora.cpp). Chunks are
  // guided (threads.h), at least kTile units (the kernels' tile of output
  // rows) and multiples of it, so a chunk holds whole A tasks: a thread's
  // weights stream as long runs (decode: 2-4% faster on SmolLM2,
  // docs/PERFORMANCE.md), and the last chunks are as short as before. The
  // first thread takes every A task at the head of its first chunk, while
  // the others start on the base rows; only a thread about to add B t waits
  // for A tasks still running.
  constexpr int64_t kTile = 16;
  const int64_t n_lora = layer >= 0 ? lora_prepare(layer, jobs) : 0;
  const int64_t first = n_lora * kTile;
  const auto run = [&](int64_t begin, int64_t end) {
    for (; begin < std::min(end, first); begin += kTile) lora_down(begin / kTile, x, n_in);
    if (begin >= end) return;
    begin -= first, end -= first;
    ReadAhead ra{kv_ahead_.data(), kv_ahead_.size(), &kv_ahead_next_};
    const ReadAheadScope scope(read_ahead && !kv_ahead_.empty() ? &ra : nullptr);
    int64_t base = 0;
    int job = 0;
    for (const MatmulJob& j : jobs) {
      const int64_t n_out = j.w->n_out;
      const int64_t o0 = std::max<int64_t>(begin - base, 0), o1 = std::min<int64_t>(end - base, n_out);
      if (o0 < o1) {
        if (n_lora > 0) lora_prefetch(job, o0, o1);
        if (j.w->x8)
          matmul_x8(j.w->type, j.w->data, j.w->x8, n_in, static_cast<int>(o0), static_cast<int>(o1), s_.xq.data(),
                    n_rows, j.y, static_cast<size_t>(n_out), xq_id_);
        else if (dtype_is_quantized(j.w->type))
          matmul_q(j.w->type, j.w->data, n_in, static_cast<int>(o0), static_cast<int>(o1), s_.xq.data(), n_rows,
                   j.y, static_cast<size_t>(n_out), xq_id_);
        else if (dtype_is_kquant(j.w->type))
          matmul_k(j.w->type, j.w->data, n_in, static_cast<int>(o0), static_cast<int>(o1), s_.xk.data(), n_rows,
                   j.y, static_cast<size_t>(n_out));
        else
          matmul_f(j.w->type, j.w->data, n_in, static_cast<int>(o0), static_cast<int>(o1),
                   j.w->type == DType::F16 ? x_f16 : j.w->type == DType::BF16 ? x_bf16 : x, n_rows, j.y,
                   static_cast<size_t>(n_out));
        if (n_lora > 0) lora_up_range(j, job, o0, o1);
      }
      base += n_out;
      ++job;
    }
  };
  pool_.parallel_for_guided(first + total, kTile, run);
}

// Angles as ggml computes them (theta_i = pos * scale^i by repeated float
// multiplication, divided by a per-pair factor and scaled linearly when the
// file asks): the positions' rounding then matches llama.cpp's.
static void rope_table(float* rc, int64_t pos, int half, float theta_scale, float linear, const float* freqs) {
  float theta = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    float angle = freqs ? theta / freqs[i] : theta;
    if (linear != 1.0f) angle = linear * angle;
    rc[i] = std::cos(angle);
    rc[half + i] = std::sin(angle);
    theta = theta * theta_scale;
  }
}

void Model::embed_rows(const std::vector<Row>& rows, size_t r0, int n) {
  const int E = cfg_.n_embd, half = cfg_.rope_dim / 2;
  const Weight& te = w_.tok_embd;
  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r0 + r];
    float* x = s_.x.data() + static_cast<size_t>(r) * E;
    dequantize_row(te.type, te.data + dtype_row_bytes(te.type, E) * row.token, x, E);
    if (cfg_.embd_scale != 1.0f)
      for (int i = 0; i < E; ++i) x[i] = x[i] * cfg_.embd_scale;
    rope_table(s_.rope.data() + static_cast<size_t>(r) * cfg_.rope_dim, row.pos, half, theta_scale_, cfg_.rope_scale,
               w_.rope_freqs);
    if (cfg_.swa_window > 0)
      rope_table(s_.rope_swa.data() + static_cast<size_t>(r) * cfg_.rope_dim, row.pos, half, theta_scale_swa_, 1.0f,
                 nullptr);
  }
}

void Model::rope(int layer, int r, float* vec, int n_heads) {
  const int hd = cfg_.head_dim, half = cfg_.rope_dim / 2;
  const std::vector<float>& table = cfg_.is_swa(layer) ? s_.rope_swa : s_.rope;
  const float* cs = table.data() + static_cast<size_t>(r) * cfg_.rope_dim;
  rope_heads(vec, n_heads, hd, half, cfg_.rope_neox, cs);
}

void Model::for_row_blocks(int n, const std::function<void(int, int)>& fn) {
  pool_.parallel_for(n, 8, [&](int64_t r0, int64_t r1) { fn(static_cast<int>(r0), static_cast<int>(r1)); });
}

// xb = norm(x) with the sublayer's input norm.
void Model::norm_rows(const float* weight, int n) {
  const int E = cfg_.n_embd;
  for_row_blocks(n, [&](int r0, int r1) {
    const size_t at = static_cast<size_t>(r0) * E;
    rmsnorm_rows(&s_.x[at], weight, &s_.xb[at], r1 - r0, E, cfg_.norm_eps);
  });
}

void Model::for_rows(int n, const std::function<void(int)>& fn) {
  pool_.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(static_cast<int>(r));
  });
}

// x += sublayer output (in xb), normed first where the model has a post-norm.
void Model::residual_add(const float* post_norm, int n) {
  const int E = cfg_.n_embd;
  for_row_blocks(n, [&](int r0, int r1) {
    float* y = &s_.xb[static_cast<size_t>(r0) * E];
    if (post_norm) rmsnorm_rows(y, post_norm, y, r1 - r0, E, cfg_.norm_eps);
    float* x = &s_.x[static_cast<size_t>(r0) * E];
    for (size_t i = 0; i < static_cast<size_t>(r1 - r0) * E; ++i) x[i] += y[i];
  });
}

// x += attention(norm(x)) for one layer, writing this step's K and V into the pages.
void Model::attention_block(int l, const std::vector<Row>& rows, size_t r0, int n,
                            std::vector<std::vector<uint8_t*>>& pages) {
  const LayerWeights& L = w_.layers[l];
  const int QD = cfg_.q_dim(), KD = cfg_.kv_dim(), hd = cfg_.head_dim;
  norm_rows(L.attn_norm, n);
  matmul({{&L.wq, s_.q.data(), LoraTarget::q}, {&L.wk, s_.k.data(), LoraTarget::k},
          {&L.wv, s_.v.data(), LoraTarget::v}},
         s_.xb.data(), n, l, true);
  // Per row: biases, q/k norms, RoPE, then this step's K/V into the pages
  // (attention then reads every position, old and new, from the same bytes).
  for_rows(n, [&](int r) {
    float* q = &s_.q[r * QD];
    float* k = &s_.k[r * KD];
    if (L.bq)
      for (int i = 0; i < QD; ++i) q[i] += L.bq[i];
    if (L.bk)
      for (int i = 0; i < KD; ++i) k[i] += L.bk[i];
    if (L.bv)
      for (int i = 0; i < KD; ++i) s_.v[r * KD + i] += L.bv[i];
    if (L.q_norm) {
      rmsnorm_rows(q, L.q_norm, q, cfg_.n_head, hd, cfg_.norm_eps);  // each head a row
      rmsnorm_rows(k, L.k_norm, k, cfg_.n_head_kv, hd, cfg_.norm_eps);
    }
    rope(l, r, q, cfg_.n_head);
    rope(l, r, k, cfg_.n_head_kv);
    const Row& row = rows[r0 + r];
    const int pt = layout_.page_tokens;
    write_kv(l, r, pages[row.item][row.pos / pt], static_cast<int>(row.pos % pt));
  });
  attention(l, rows, r0, n, pages);

  matmul({{&L.wo, s_.xb.data(), LoraTarget::o}}, s_.att.data(), n, l);
  if (L.bo)  // llama.cpp's build_attn: wo x (LoRA included), then + wo_b
    for_rows(n, [&](int r) {
      float* y = &s_.xb[static_cast<size_t>(r) * cfg_.n_embd];
      for (int i = 0; i < cfg_.n_embd; ++i) y[i] += L.bo[i];
    });
  residual_add(L.attn_post_norm, n);
}

// x += ffn(norm(x)) for one layer: SwiGLU, or GeGLU for gemma.
void Model::ffn_block(int l, int n) {
  const LayerWeights& L = w_.layers[l];
  const int F = cfg_.n_ff;
  norm_rows(L.ffn_norm, n);
  matmul({{&L.gate, s_.hb.data(), LoraTarget::gate}, {&L.up, s_.hb2.data(), LoraTarget::up}}, s_.xb.data(), n, l);
  for_rows(n, [&](int r) {
    if (cfg_.gelu_ffn)
      gelu_mul(&s_.hb[r * F], &s_.hb2[r * F], F);
    else
      silu_mul(&s_.hb[r * F], &s_.hb2[r * F], F);
  });
  matmul({{&L.down, s_.xb.data(), LoraTarget::down}}, s_.hb.data(), n, l, true);
  residual_add(L.ffn_post_norm, n);
}

// Final norm, hidden states and logits for the rows that asked for them.
void Model::output_rows(std::vector<BatchItem>& items, const std::vector<Row>& rows, size_t r0, int n) {
  const int E = cfg_.n_embd;
  int n_out = 0;
  std::vector<float*>& dst = s_.logit_dst;
  dst.clear();
  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r0 + r];
    BatchItem& it = items[row.item];
    const int64_t first = it.seq->n_tokens();
    const int64_t idx = row.pos - first;  // index of this token within the item
    const bool last = idx == it.n_tokens - 1;
    const bool want_logits = it.logits && (it.all_logits || last);
    if (!want_logits && !it.hidden) continue;
    float* normed = &s_.xlog[static_cast<size_t>(n_out) * E];
    rmsnorm(&s_.x[r * E], w_.output_norm, normed, E, cfg_.norm_eps);
    if (it.hidden) std::memcpy(it.hidden + idx * E, normed, sizeof(float) * E);
    if (!want_logits) continue;
    dst.push_back(it.logits + (it.all_logits ? idx : 0) * static_cast<int64_t>(cfg_.n_vocab));
    ++n_out;
  }
  if (n_out == 0) return;
  // Logits go to a scratch block row by row; the output matmul is the largest
  // in the model, so all requested rows share one pass over its weights.
  std::vector<float>& block = s_.logits;
  const size_t V = static_cast<size_t>(cfg_.n_vocab);
  if (block.size() < n_out * V) block.resize(n_out * V);
  matmul({{&w_.output, block.data()}}, s_.xlog.data(), n_out);
  if (cfg_.logit_softcap > 0.0f) {
    const float c = cfg_.logit_softcap, inv = 1.0f / c;
    for (size_t i = 0; i < n_out * V; ++i) block[i] = c * std::tanh(block[i] * inv);
  }
  for (int i = 0; i < n_out; ++i) std::memcpy(dst[i], block.data() + i * V, sizeof(float) * V);
}

void Model::run_rows(std::vector<BatchItem>& items, const std::vector<Row>& rows, size_t r0, size_t r1,
                     std::vector<std::vector<uint8_t*>>& pages) {
  const int n = static_cast<int>(r1 - r0);
  embed_rows(rows, r0, n);
  lora_runs(items, rows, r0, n);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    attention_block(l, rows, r0, n, pages);
    // Layer l + 1's K and V, read while the down projection and its Q, K, V
    // projections multiply (plan_kv_ahead).
    plan_kv_ahead(l + 1, rows, r0, n, pages);
    ffn_block(l, n);
  }
  kv_ahead_.clear();
  output_rows(items, rows, r0, n);
}

void Model::forward(std::vector<BatchItem>& items) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Row> rows;
  for (size_t i = 0; i < items.size(); ++i) {
    BatchItem& it = items[i];
    if (!it.seq) throw std::invalid_argument("batch item without a sequence");
    for (size_t j = 0; j < i; ++j)
      if (items[j].seq == it.seq) throw std::invalid_argument("a sequence appears twice in one batch");
    const PageLayout& lay = it.seq->pool().layout();
    if (lay != page_layout(lay.page_tokens, lay.dtype))
      throw std::invalid_argument("sequence pages do not match this model's KV shape");
    if (const SwaRelease* swa = it.seq->swa()) {
      std::vector<int> kept;
      for (int l = 0; l < cfg_.n_layer; ++l)
        if (kept_index_[l] >= 0) kept.push_back(l);
      if (cfg_.swa_window <= 0 || swa->window != cfg_.swa_window || swa->keep_layers != kept)
        throw std::invalid_argument("the sequence releases pages with another sliding window than this model's");
    }
    for (const LoraUse& use : it.loras)
      if (!use.adapter || use.adapter->owner() != this)
        throw std::invalid_argument("a LoRA adapter loaded for another model");
      else if (!std::isfinite(use.scale))
        throw std::invalid_argument("a LoRA scale must be a finite number");
    if (it.seq->n_tokens() + it.n_tokens > cfg_.n_ctx)
      throw std::length_error("context length exceeded: " + std::to_string(it.seq->n_tokens() + it.n_tokens) +
                              " tokens > " + std::to_string(cfg_.n_ctx));
    for (int t = 0; t < it.n_tokens; ++t)
      if (it.tokens[t] < 0 || it.tokens[t] >= cfg_.n_vocab)
        throw std::out_of_range("token id " + std::to_string(it.tokens[t]) + " outside the vocabulary");
    for (int t = 0; t < it.n_tokens; ++t) rows.push_back({static_cast<int>(i), it.seq->n_tokens() + t, it.tokens[t]});
  }
  if (rows.empty()) return;
  layout_ = items[0].seq->pool().layout();
  for (const BatchItem& it : items)
    if (it.seq->pool().layout() != layout_)
      throw std::invalid_argument("sequences with different page layouts (size or KV dtype) in one batch");

  int64_t max_ctx = 0;
  for (BatchItem& it : items) {
    it.seq->prepare_append(it.n_tokens);
    max_ctx = std::max(max_ctx, it.seq->n_tokens() + it.n_tokens);
  }
  std::vector<std::vector<uint8_t*>> pages(items.size());
  released_.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    items[i].seq->page_ptrs(pages[i]);
    released_[i] = items[i].seq->n_released();
  }

  ensure_scratch(std::min<int>(kMaxRows, static_cast<int>(rows.size())));
  // Per thread: kMaxGroup rows of scores (padded to whole pages) and their heads' q.
  s_.score_row = static_cast<int>(round_up(max_ctx, 16));
  const size_t need_scores = static_cast<size_t>(pool_.size()) * kMaxGroup * (s_.score_row + cfg_.head_dim);
  if (s_.scores.size() < need_scores) s_.scores.assign(std::max(need_scores, s_.scores.size() * 2), 0.0f);

  try {
    for (size_t r0 = 0; r0 < rows.size(); r0 += kMaxRows)
      run_rows(items, rows, r0, std::min(rows.size(), r0 + kMaxRows), pages);
  } catch (...) {
    // Leave every sequence as it was: zero the slots this step may have written.
    for (BatchItem& it : items) {
      it.seq->commit_append(it.n_tokens);
      it.seq->truncate(it.seq->n_tokens() - it.n_tokens);
    }
    throw;
  }
  for (BatchItem& it : items) it.seq->commit_append(it.n_tokens);
}

}  // namespace ctx
