// LoRA adapters applied at run time, never merged into the base weights:
//   y = W x + sum over the row's adapters a, in order, of  s_a * (B_a (A_a x))
// with s_a = scale_a * alpha_a / rank (scale_a alone when the file's alpha is
// 0, as llama.cpp does). t = A_a x is matmul_f (kernels/quant/quant.h) and
// y += s_a * (B_a t) is lora::up (kernels/lora/lora_kernels.h), both in matmul_f's
// canonical order, per row, after the base matmul, adapter by adapter in the
// order the batch item lists them: a row's result depends only on its own
// input and its adapters, never on the thread count, the chunking or the
// other rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quant/quant.h"

namespace ctx {

struct ModelConfig;

// The matrices an adapter may target, per layer (GGUF names in lora.cpp).
enum class LoraTarget : int { q, k, v, o, gate, up, down, count };

struct LoraPair {
  // f32, or (wtype F16, BF16) 16-bit as the file holds them: half the bytes a token reads.
  std::vector<float> a;      // (rank, n_in) A, row-major (GGUF lora_a: ne0 = n_in, ne1 = rank)
  std::vector<float> bt;     // (rank, n_out) B transposed (GGUF lora_b is (n_out, rank)) in lora::up's blocks
  std::vector<uint16_t> a16, bt16;  // the same as f16 or bf16 bits, when wtype is F16 or BF16
  DType wtype = DType::F32;
  int rank = 0, n_in = 0, n_out = 0;
};

class LoraAdapter {
 public:
  // For a model of this config (its shapes are checked by set); `owner`
  // identifies that model, so a forward of another one refuses it.
  LoraAdapter(const ModelConfig& cfg, const void* owner, float alpha);

  // Takes A (rank, n_in) and B (n_out, rank), row-major, for one matrix; throws
  // std::invalid_argument naming the matrix if the shapes do not fit.
  void set(int layer, LoraTarget t, std::vector<float> a, std::vector<float> b, int rank);
  // The same from f16 or bf16 matrices (`type` F16 or BF16: their bits), kept as
  // they are (every product widens each value exactly).
  void set_16bit(int layer, LoraTarget t, DType type, std::vector<uint16_t> a, std::vector<uint16_t> b, int rank);
  const LoraPair* get(int layer, LoraTarget t) const {
    const LoraPair& p = pairs_[static_cast<size_t>(layer) * kTargets + static_cast<int>(t)];
    return p.rank > 0 ? &p : nullptr;
  }
  // The factor of B (A x) for a user scale: llama.cpp's llama_adapter_lora_weight::get_scale.
  float factor(const LoraPair& p, float scale) const {
    return alpha_ != 0.0f ? scale * alpha_ / static_cast<float>(p.rank) : scale;
  }
  const void* owner() const { return owner_; }
  int n_matrices() const;

  static constexpr int kTargets = static_cast<int>(LoraTarget::count);
  static LoraTarget target_from_name(const std::string& name);  // "attn_q", ... "ffn_down"

 private:
  // Checks the shapes; the pair to fill, its rank and shape set.
  LoraPair& slot(int layer, LoraTarget t, size_t a_size, size_t b_size, int rank);

  const void* owner_;
  float alpha_;
  int n_layer_;
  int dims_[kTargets][2];       // (n_in, n_out) of each target in this model
  std::vector<LoraPair> pairs_;  // (n_layer, kTargets); rank 0 where the adapter has none
};

// One adapter a batch item runs with, and its user scale.
struct LoraUse {
  const LoraAdapter* adapter = nullptr;
  float scale = 1.0f;
};

}  // namespace ctx
