#include "models/lora.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/lora/lora_kernels.h"
#include "models/model.h"

namespace ctx {

namespace {

const char* const kTargetNames[LoraAdapter::kTargets] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                         "ffn_gate", "ffn_up", "ffn_down"};

}  // namespace

LoraAdapter::LoraAdapter(const ModelConfig& cfg, const void* owner, float alpha)
    : owner_(owner), alpha_(alpha), n_layer_(cfg.n_layer) {
  if (!std::isfinite(alpha)) throw std::invalid_argument("adapter alpha is not a finite number");
  const int E = cfg.n_embd, QD = cfg.q_dim(), KD = cfg.kv_dim(), F = cfg.n_ff;
  const int dims[kTargets][2] = {{E, QD}, {E, KD}, {E, KD}, {QD, E}, {E, F}, {E, F}, {F, E}};
  for (int t = 0; t < kTargets; ++t) {
    dims_[t][0] = dims[t][0];
    dims_[t][1] = dims[t][1];
  }
  pairs_.resize(static_cast<size_t>(n_layer_) * kTargets);
}

LoraTarget LoraAdapter::target_from_name(const std::string& name) {
  for (int t = 0; t < kTargets; ++t)
    if (name == kTargetNames[t]) return static_cast<LoraTarget>(t);
  throw std::invalid_argument("LoRA on " + name + " is not supported (only attn_q, attn_k, attn_v, attn_output, "
                              "ffn_gate, ffn_up, ffn_down)");
}

LoraPair& LoraAdapter::slot(int layer, LoraTarget t, DType atype, size_t a_bytes, DType btype, size_t b_bytes,
                            int rank) {
  const int ti = static_cast<int>(t);
  if (ti < 0 || ti >= kTargets) throw std::invalid_argument("unknown LoRA target");
  const std::string what = "blk." + std::to_string(layer) + "." + kTargetNames[ti];
  if (layer < 0 || layer >= n_layer_)
    throw std::invalid_argument(what + ": the model has " + std::to_string(n_layer_) + " layers");
  if (rank <= 0) throw std::invalid_argument(what + ": LoRA rank must be positive, not " + std::to_string(rank));
  if (atype != DType::F32 && atype != DType::F16 && atype != DType::BF16 && atype != DType::Q8_0)
    throw std::invalid_argument(what + ": lora_a must be F32, F16, BF16 or Q8_0");
  if (btype != DType::F32 && btype != DType::F16 && btype != DType::BF16)
    throw std::invalid_argument(what + ": lora_b must be F32, F16 or BF16");
  const int n_in = dims_[ti][0], n_out = dims_[ti][1];
  if (n_in % dtype_block_elems(atype) != 0)
    throw std::invalid_argument(what + ": " + dtype_name(static_cast<int>(atype)) + " rows of " +
                                std::to_string(n_in) + " elements are not whole blocks");
  if (a_bytes != static_cast<size_t>(rank) * dtype_row_bytes(atype, n_in) ||
      b_bytes != static_cast<size_t>(rank) * dtype_row_bytes(btype, n_out))
    throw std::invalid_argument(what + ": lora_a must be [" + std::to_string(n_in) + ", rank] and lora_b [rank, " +
                                std::to_string(n_out) + "] for this model");
  LoraPair& p = pairs_[static_cast<size_t>(layer) * kTargets + ti];
  p = LoraPair{};
  p.rank = rank;
  p.n_in = n_in;
  p.n_out = n_out;
  p.atype = atype;
  p.btype = btype;
  return p;
}

void LoraAdapter::set(int layer, LoraTarget t, DType atype, const uint8_t* a, size_t a_bytes, DType btype,
                      const uint8_t* b, size_t b_bytes, int rank) {
  LoraPair& p = slot(layer, t, atype, a_bytes, btype, b_bytes, rank);
  p.a.assign(a, a + a_bytes);
  if (btype == DType::F32) {
    std::vector<float> rows(b_bytes / sizeof(float));
    std::memcpy(rows.data(), b, b_bytes);
    p.bt = lora::blocks(rows.data(), p.n_out, rank);
  } else {
    std::vector<uint16_t> rows(b_bytes / sizeof(uint16_t));
    std::memcpy(rows.data(), b, b_bytes);
    p.bt16 = lora::blocks(rows.data(), p.n_out, rank);
  }
}

size_t LoraAdapter::n_bytes() const {
  size_t n = 0;
  for (const LoraPair& p : pairs_) n += p.a.size() + p.bt.size() * sizeof(float) + p.bt16.size() * sizeof(uint16_t);
  return n;
}

int LoraAdapter::n_matrices() const {
  int n = 0;
  for (const LoraPair& p : pairs_) n += p.rank > 0;
  return n;
}

}  // namespace ctx
