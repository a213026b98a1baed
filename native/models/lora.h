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
  // A and B as the file holds them, each in its own type: A's rows as matmul_f
  // reads them (F32, F16, BF16 or Q8_0), B in lora::up's blocks (F32, or F16 and
  // BF16 bits in bt16). Kept as they are, every product widens each value
  // exactly: a Q8_0 A reads a quarter of the bytes its f32 widening would.
  std::vector<uint8_t> a;     // (rank, n_in) A, row-major (GGUF lora_a: ne0 = n_in, ne1 = rank), atype's rows
  std::vector<float> bt;      // (rank, n_out) B transposed (GGUF lora_b is (n_out, rank)) in lora::up's blocks
  std::vector<uint16_t> bt16; // the same as f16 or bf16 bits, when btype is F16 or BF16
  DType atype = DType::F32, btype = DType::F32;
  int rank = 0, n_in = 0, n_out = 0;
};

class LoraAdapter {
 public:
  // For a model of this config (its shapes are checked by set); `owner`
  // identifies that model, so a forward of another one refuses it.
  LoraAdapter(const ModelConfig& cfg, const void* owner, float alpha);

  // Takes A (rank, n_in) as `atype` rows (F32, F16, BF16 or Q8_0: their bytes)
  // and B (n_out, rank), row-major, as `btype` (F32 floats' bytes, or F16 or
  // BF16 bits), for one matrix; throws std::invalid_argument naming the matrix
  // if the types or the shapes do not fit.
  void set(int layer, LoraTarget t, DType atype, const uint8_t* a, size_t a_bytes, DType btype, const uint8_t* b,
           size_t b_bytes, int rank);
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
  size_t n_bytes() const;  // what its matrices hold in memory

  static constexpr int kTargets = static_cast<int>(LoraTarget::count);
  static LoraTarget target_from_name(const std::string& name);  // "attn_q", ... "ffn_down"

 private:
  // Checks the types and shapes; the pair to fill, its rank and shape set.
  LoraPair& slot(int layer, LoraTarget t, DType atype, size_t a_bytes, DType btype, size_t b_bytes, int rank);

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
