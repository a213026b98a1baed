#include "models/lora.h"

#include <cmath>
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

LoraPair& LoraAdapter::slot(int layer, LoraTarget t, size_t a_size, size_t b_size, int rank) {
  const int ti = static_cast<int>(t);
  if (ti < 0 || ti >= kTargets) throw std::invalid_argument("unknown LoRA target");
  const std::string what = "blk." + std::to_string(layer) + "." + kTargetNames[ti];
  if (layer < 0 || layer >= n_layer_)
    throw std::invalid_argument(what + ": the model has " + std::to_string(n_layer_) + " layers");
  if (rank <= 0) throw std::invalid_argument(what + ": LoRA rank must be positive, not " + std::to_string(rank));
  const int n_in = dims_[ti][0], n_out = dims_[ti][1];
  if (a_size != static_cast<size_t>(rank) * n_in || b_size != static_cast<size_t>(rank) * n_out)
    throw std::invalid_argument(what + ": lora_a must be [" + std::to_string(n_in) + ", rank] and lora_b [rank, " +
                                std::to_string(n_out) + "] for this model");
  LoraPair& p = pairs_[static_cast<size_t>(layer) * kTargets + ti];
  p = LoraPair{};
  p.rank = rank;
  p.n_in = n_in;
  p.n_out = n_out;
  return p;
}

void LoraAdapter::set(int layer, LoraTarget t, std::vector<float> a, std::vector<float> b, int rank) {
  LoraPair& p = slot(layer, t, a.size(), b.size(), rank);
  p.a = std::move(a);
  p.bt = lora::blocks(b.data(), p.n_out, rank);
}

void LoraAdapter::set_16bit(int layer, LoraTarget t, DType type, std::vector<uint16_t> a, std::vector<uint16_t> b,
                            int rank) {
  if (type != DType::F16 && type != DType::BF16) throw std::invalid_argument("16-bit LoRA matrices are F16 or BF16");
  LoraPair& p = slot(layer, t, a.size(), b.size(), rank);
  p.a16 = std::move(a);
  p.bt16 = lora::blocks(b.data(), p.n_out, rank);
  p.wtype = type;
}

int LoraAdapter::n_matrices() const {
  int n = 0;
  for (const LoraPair& p : pairs_) n += p.rank > 0;
  return n;
}

}  // namespace ctx
