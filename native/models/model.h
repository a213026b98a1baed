// A decoder-only transformer over memory-mapped GGUF weights.
//
// Three structs tell the story of a forward pass (after llama2.c): the config
// (shapes), the weights (pointers into the mapped file, owned by Python), and
// the run state (scratch buffers, grown once, reused every step).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kv/page_pool.h"
#include "models/lora.h"
#include "kernels/prefetch.h"
#include "kernels/quant/quant.h"

namespace ctx {

struct ModelConfig {
  std::string arch;        // "llama", "qwen2", "qwen3", ...
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ff = 0;
  int n_vocab = 0;
  int64_t n_ctx = 0;       // trained context length (from the file)
  float norm_eps = 1e-5f;
  float rope_base = 10000.0f;
  int rope_dim = 0;        // rotated dims per head (<= head_dim)
  bool rope_neox = false;  // pairs (i, i + d/2) instead of (2i, 2i + 1)
  float rope_scale = 1.0f;      // linear RoPE scaling of full-attention layers: angles * rope_scale
  // Gemma-style options; the defaults give the llama family.
  float attn_scale = 0.0f;      // q.k scale; 0 means 1 / sqrt(head_dim)
  float embd_scale = 1.0f;      // token embeddings are multiplied by this (gemma: sqrt(n_embd))
  bool gelu_ffn = false;        // GeGLU (tanh GELU of the gate) instead of SwiGLU
  float logit_softcap = 0.0f;   // logits = c * tanh(logits / c) when > 0
  // Sliding-window attention: layer l with swa_layer[l] sees only the last
  // swa_window positions (keys k with pos - k < swa_window) and rotates with
  // rope_base_swa (and no linear scaling).
  int swa_window = 0;
  std::vector<uint8_t> swa_layer;  // (n_layer) 1 for a sliding-window layer, or empty for none
  float rope_base_swa = 10000.0f;
  // Not the file's: the bytes the blocks-of-32 matrices' copies laid out for
  // products of one or two rows may take (Model::repack_weights; the same
  // logits either way).
  size_t repack_budget = size_t{512} << 20;
  bool is_swa(int layer) const { return swa_window > 0 && !swa_layer.empty() && swa_layer[layer] != 0; }
  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
};

struct Weight {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  int n_in = 0;    // row length (GGUF ne0)
  int n_out = 0;   // rows (GGUF ne1)
  const uint8_t* x8 = nullptr;  // data repacked for decode (quant.h repack_x8), or null
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // (n_embd)
  Weight wq, wk, wv, wo;
  // Biases, each optional (null: none), as in llama.cpp: qwen2's q/k/v, any of them in the
  // other architectures (or parts of a fused attn_qkv.bias), llama's attention-output bias.
  const float* bq = nullptr;         // (q_dim)
  const float* bk = nullptr;         // (kv_dim)
  const float* bv = nullptr;         // (kv_dim)
  const float* bo = nullptr;         // (n_embd) added to wo's output, before any post-norm
  const float* q_norm = nullptr;     // (head_dim) qwen3
  const float* k_norm = nullptr;     // (head_dim) qwen3
  const float* attn_post_norm = nullptr;  // (n_embd) gemma3: norm of the attention output
  const float* ffn_norm = nullptr;   // (n_embd)
  Weight gate, up, down;
  const float* ffn_post_norm = nullptr;   // (n_embd) gemma3: norm of the FFN output
};

struct ModelWeights {
  Weight tok_embd;                   // (n_vocab, n_embd)
  const float* output_norm = nullptr;
  Weight output;                     // (n_vocab, n_embd); the embedding when tied
  const float* rope_freqs = nullptr; // (rope_dim / 2) llama3: per-pair divisors of the angle, or null
  std::vector<LayerWeights> layers;
};

// One sequence's share of a forward step.
struct BatchItem {
  KVSeq* seq = nullptr;
  const int32_t* tokens = nullptr;
  int n_tokens = 0;
  bool all_logits = false;  // logits for every new position, else only the last
  float* logits = nullptr;  // (all_logits ? n_tokens : 1, n_vocab), or null for none
  float* hidden = nullptr;  // (n_tokens, n_embd) final normed hidden states, or null (embeddings)
  std::vector<LoraUse> loras;  // adapters of this sequence, added in this order (models/lora.h)
};

struct RunState {
  std::vector<float> x;       // (rows, n_embd) residual stream
  std::vector<float> xb;      // (rows, n_embd) normed input of a sublayer
  std::vector<BlockQ8A> xq;   // (rows, max_in / 32) quantized matmul input (blocks of 32)
  std::vector<BlockQ8K> xk;   // (rows, max_in / 256) quantized matmul input (K-quants)
  std::vector<float> xr;      // (2, rows, max_in) matmul input rounded to f16, and to bf16 (F16, BF16 weights)
  std::vector<float> q;       // (rows, q_dim)
  std::vector<float> k;       // (rows, kv_dim)
  std::vector<float> v;       // (rows, kv_dim)
  std::vector<float> att;     // (rows, q_dim) attention output
  std::vector<float> hb;      // (rows, n_ff) gate
  std::vector<float> hb2;     // (rows, n_ff) up
  std::vector<float> rope;    // (rows, 2, rope_dim / 2) cos, then sin, per position (full-attention layers)
  std::vector<float> rope_swa;  // (rows, 2, rope_dim / 2) the same for sliding-window layers
  std::vector<float> scores;  // (threads, kMaxGroup, score_row + head_dim) attention scores, then q
  std::vector<float> split_scores;  // (queries, score_row) scores of a step split by parts of the KV, task by task
  std::vector<float> split_q;       // (queries, head_dim) their queries, rounded
  int score_row = 0;          // this step's longest context, rounded up to whole pages of 16
  std::vector<float> xlog;    // (rows, n_embd) rows that want logits or hidden states, normed
  std::vector<float> logits;  // (rows, n_vocab) logits before they are copied out
  std::vector<float*> logit_dst;  // (rows) where each logits row goes
  std::vector<float> lora_t;  // (sum over LoRA terms of rows * rank) A x of each term
};

class Model {
 public:
  Model(ModelConfig config, ModelWeights weights, int n_threads);

  const ModelConfig& config() const { return cfg_; }
  int n_threads() const { return pool_.size(); }
  size_t repacked_bytes() const { return repacked_bytes_; }  // repack_weights
  // The pages this model's sequences use; throws for a KV dtype the model's
  // shape cannot take (quantized KV needs head_dim % 32 == 0).
  PageLayout page_layout(int page_tokens, KVDType dtype) const;

  // Runs every item's tokens through the model, appending their KV to each
  // item's sequence, and writes the requested logits. Items must name
  // distinct sequences. Thread-safe (forwards are serialized).
  void forward(std::vector<BatchItem>& items);

 private:
  struct Row {         // one token position of one item
    int item;
    int64_t pos;
    int32_t token;
  };
  // One chunk of rows through the whole model, in named steps.
  void run_rows(std::vector<BatchItem>& items, const std::vector<Row>& rows, size_t r0, size_t r1,
                std::vector<std::vector<uint8_t*>>& pages);
  void embed_rows(const std::vector<Row>& rows, size_t r0, int n);  // x and the RoPE tables
  void rope(int layer, int r, float* vec, int n_heads);  // row r's n_heads heads, in place
  // fn(r) for each row r in [0, n), rows split across the pool (rows are independent).
  void for_rows(int n, const std::function<void(int)>& fn);
  // fn(r0, r1) for blocks of up to 8 rows, split across the pool.
  void for_row_blocks(int n, const std::function<void(int, int)>& fn);
  void norm_rows(const float* weight, int n);            // xb = norm(x), rows [0, n)
  void residual_add(const float* post_norm, int n);      // x += post_norm ? norm(xb) : xb
  void attention_block(int layer, const std::vector<Row>& rows, size_t r0, int n,
                       std::vector<std::vector<uint8_t*>>& pages);
  void ffn_block(int layer, int n);
  void output_rows(std::vector<BatchItem>& items, const std::vector<Row>& rows, size_t r0, int n);
  struct MatmulJob {
    const Weight* w;
    float* y;  // (n_rows, w->n_out)
    LoraTarget target = LoraTarget::count;  // which adapter matrices apply (count: none)
  };
  // Several matmuls over the same input x (n_rows, n_in) in one parallel
  // region: decode runs hundreds of them per token, and each region costs a
  // wake-up and a barrier.
  // With a layer, each row's LoRA adapters are added too (lora_prepare, lora_down, lora_up_range).
  // read_ahead: its kernels also ask for the lines of kv_ahead_ (plan_kv_ahead).
  void matmul(std::initializer_list<MatmulJob> jobs, const float* x, int n_rows, int layer = -1,
              bool read_ahead = false);
  struct LoraRun {     // consecutive rows of one item that has adapters
    int r0, r1;
    const std::vector<LoraUse>* loras;
  };
  struct LoraTerm {    // one adapter's product for one run and one matmul job
    int job;
    const LoraPair* p;
    float factor;
    int r0, r1;
    size_t t_off;      // its A x in s_.lora_t
  };
  struct LoraTask {    // one block of a term's rows whose A x one thread computes
    int term, block;
  };
  void lora_runs(const std::vector<BatchItem>& items, const std::vector<Row>& rows, size_t r0, int n);
  // model_lora.cpp, inside the matmul's parallel region: the terms of this
  // matmul and the number of their A x tasks (0: none); task i's t = A x; then
  // y += factor * B t over output rows [o0, o1) of job number `job`, once
  // every task is done.
  int64_t lora_prepare(int layer, std::initializer_list<MatmulJob> jobs);
  void lora_down(int64_t i, const float* x, int n_in);
  void lora_prefetch(int job, int64_t o0, int64_t o1) const;
  void lora_up_range(const MatmulJob& j, int job, int64_t o0, int64_t o1);
  void quantize_rows(const float* x, int n_rows, int n_in, ActFormat format);
  // Store row r of s_.k / s_.v (this layer's new K and V) in slot `slot` of a page.
  void write_kv(int layer, int r, uint8_t* page, int slot);
  void attention(int layer, const std::vector<Row>& rows, size_t r0,
                 int n_rows, const std::vector<std::vector<uint8_t*>>& pages);
  struct AttnLayer;   // one layer's attention constants (model_attention.cpp)
  struct AttnView;    // what one row sees of the KV on a layer
  struct AttnBundle;  // rows that read the same pages, attended together
  struct AttnTask;    // a bundle's heads that one task attends
  static constexpr int kMaxSplitRows = 32;  // most rows a step splits by parts of the KV (their scores held at once)
  static constexpr int64_t kLongKeys = 512;  // keys from which one decoded row's attention splits by parts
  static constexpr int kHotRows = 16;        // a sequence's rows in a step from which its pages count as in cache
  std::vector<AttnTask> attention_tasks(const AttnLayer& at, const std::vector<AttnView>& views) const;
  bool split_by_parts(const AttnLayer& at, const std::vector<AttnView>& views,
                      const std::vector<AttnTask>& tasks) const;
  bool lone_and_long(const AttnLayer& at, const std::vector<AttnView>& views) const;
  void attend_in_parts(const AttnLayer& at, const std::vector<AttnTask>& tasks);
  static constexpr int64_t kKAhead = 2;      // pages ahead a part's scoring asks for the K of (prefetch_k)
  void prefetch_k(const AttnLayer& at, const AttnTask& k, int64_t p) const;
  // The K and V a decode step's rows will attend on `layer` (each visible
  // page's block of that layer), for the matmuls before it to ask for.
  void plan_kv_ahead(int layer, const std::vector<Row>& rows, size_t r0, int n,
                     const std::vector<std::vector<uint8_t*>>& pages);
  // Rows a step plans for: the AVX-512 rows kernel's reach (quant_rows_avx512.cpp, the one
  // that asks: on the AVX2 one, forced on Zen 4, 8 streams measured 0.98x), and the most
  // bytes a layer's plan lists (a few times a core's L2).
  static constexpr int kAheadMinRows = 3, kAheadMaxRows = 32;
  static constexpr size_t kAheadBytes = 4 << 20;
  void attend_q(const AttnLayer& at, const AttnTask& k, float* q);
  void attend_scores(const AttnLayer& at, const AttnTask& k, const float* q, float* sc, int64_t pa, int64_t pb);
  void attend_softmax(const AttnLayer& at, const AttnTask& k, float* sc);
  void attend_values(const AttnLayer& at, const AttnTask& k, const float* sc, int d0, int d1);
  void ensure_scratch(int rows);
  // The matrices' copies in decode's layout (quant.h repack_x8), in x8_.
  void repack_weights();

  ModelConfig cfg_;
  ModelWeights w_;
  ThreadPool pool_;
  std::vector<std::unique_ptr<uint8_t[]>> x8_;  // the weights' x8 copies (repack_weights)
  size_t repacked_bytes_ = 0;
  RunState s_;
  int scratch_rows_ = 0;
  float theta_scale_ = 1.0f;     // rope_base^(-2 / rope_dim)
  float theta_scale_swa_ = 1.0f; // rope_base_swa^(-2 / rope_dim)
  std::vector<int> kept_index_;   // (n_layer) a full-attention layer's index in a released page, else -1
  std::vector<int64_t> released_; // (items) released leading pages of each item's sequence, this step
  uint64_t xq_id_ = 0;            // names the rows in s_.xq for the kernels (quant.h matmul_q's x_id)
  std::vector<LoraRun> lora_runs_;   // this chunk's rows with adapters
  std::vector<LoraTerm> lora_terms_; // this matmul's adapter terms (lora_prepare)
  std::vector<LoraTask> lora_tasks_; // their A x tasks, run first in the matmul's region
  std::atomic<int64_t> lora_a_done_{0};  // A x tasks finished (release: their t is written)
  PageLayout layout_;             // of the sequences last seen (checked per forward)
  std::vector<ReadRange> kv_ahead_;            // plan_kv_ahead's blocks (empty: none)
  std::atomic<size_t> kv_ahead_next_{0};       // the next of them a matmul thread claims
  std::mutex mu_;
};

}  // namespace ctx
