// The three kernel tables, filled by name from each path's functions, and
// the one choice among them.
#include "kernels/kernels.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include "kernels/activations/activations_impl.h"
#include "kernels/attention/attention.h"
#include "kernels/lora/lora_kernels.h"
#include "kernels/prefetch.h"
#include "kernels/quant/quant_impl.h"

namespace ctx {

namespace {

const Kernels& scalar_table() {
  static const Kernels k = [] {
    Kernels t{};
    t.isa = Isa::scalar;
    t.f16_to_f32 = qk::f16_to_f32_soft;
    t.f32_to_f16 = qk::f32_to_f16_soft;
    t.f32_to_f16_row = qk::f32_to_f16_row_scalar;
    t.round_row_f16 = qk::round_row_f16_scalar;
    t.round_row_bf16 = qk::round_row_bf16_scalar;
    t.quantize_row_q8k = qk::quantize_row_q8k_scalar;
    t.quantize_row_q8a = qk::quantize_row_q8a_scalar;
    t.matmul_q = qk::matmul_q_scalar;
    t.matmul_k = qk::matmul_k_scalar;
    t.matmul_f = qk::matmul_f_scalar;
    t.attn_scores_f16 = attn::scores_scalar;
    t.attn_scores_q8 = attn::scores_q8_scalar;
    t.attn_accumulate_f16 = attn::accumulate_scalar;
    t.attn_accumulate_q8 = attn::accumulate_q8_scalar;
    t.max_f32 = attn::max_scalar;
    t.scale_round_f16 = attn::scale_round_scalar;
    t.exp_shift_sum = act::exp_shift_sum_scalar;
    t.silu_mul = act::silu_mul_scalar;
    t.rmsnorm_rows = act::rmsnorm_rows_scalar;
    t.gelu_mul = act::gelu_mul_scalar;
    t.rope = act::rope_scalar;
    t.lora_up = lora::up_scalar;
    t.lora_up_f16 = lora::up_f16_scalar;
    t.lora_up_bf16 = lora::up_bf16_scalar;
    return t;
  }();
  return k;
}

const Kernels& avx2_table() {
  static const Kernels k = [] {
    Kernels t = scalar_table();
    t.isa = Isa::avx2;
    t.f16_to_f32 = qk::f16_to_f32_hw;
    t.f32_to_f16 = qk::f32_to_f16_hw;
    t.f32_to_f16_row = qk::f32_to_f16_row_avx2;
    t.round_row_f16 = qk::round_row_f16_avx2;
    t.round_row_bf16 = qk::round_row_bf16_avx2;
    t.quantize_row_q8a = qk::quantize_row_q8a_avx2;
    t.matmul_q = qk::matmul_q_avx2;
    t.matvec_x8 = qk::matvec_x8_avx2;
    t.matmul_k = qk::matmul_k_avx2;
    t.matmul_f = qk::matmul_f_avx2;
    t.attn_scores_f16 = attn::scores_avx2;
    t.attn_scores_q8 = attn::scores_q8_avx2;
    t.attn_accumulate_f16 = attn::accumulate_avx2;
    t.attn_accumulate_q8 = attn::accumulate_q8_avx2;
    t.max_f32 = attn::max_avx2;
    t.scale_round_f16 = attn::scale_round_avx2;
    t.exp_shift_sum = act::exp_shift_sum_avx2;
    t.silu_mul = act::silu_mul_avx2;
    t.rmsnorm_rows = act::rmsnorm_rows_avx2;
    t.gelu_mul = act::gelu_mul_avx2;
    t.rope = act::rope_avx2;
    t.lora_up = lora::up_avx2;
    t.lora_up_f16 = lora::up_f16_avx2;
    t.lora_up_bf16 = lora::up_bf16_avx2;
    t.quantize_row_q8k = qk::quantize_row_q8k_avx2;
    return t;
  }();
  return k;
}

const Kernels& avx512_table() {
  static const Kernels k = [] {
    Kernels t = avx2_table();
    t.isa = Isa::avx512;
    t.f32_to_f16_row = qk::f32_to_f16_row_avx512;
    t.round_row_f16 = qk::round_row_f16_avx512;
    t.round_row_bf16 = qk::round_row_bf16_avx512;
    t.quantize_row_q8k = qk::quantize_row_q8k_avx512;
    t.quantize_row_q8a = qk::quantize_row_q8a_avx512;
    t.matmul_q = qk::matmul_q_avx512;
    t.matvec_x8 = qk::matvec_x8_avx512;
    t.matmul_k = qk::matmul_k_avx512;
    t.matmul_f = qk::matmul_f_avx512;
    t.attn_scores_f16 = attn::scores_avx512;
    t.attn_scores_q8 = attn::scores_q8_avx512;
    t.attn_accumulate_f16 = attn::accumulate_avx512;
    t.attn_accumulate_q8 = attn::accumulate_q8_avx512;
    t.max_f32 = attn::max_avx512;
    t.scale_round_f16 = attn::scale_round_avx512;
    t.exp_shift_sum = act::exp_shift_sum_avx512;
    t.silu_mul = act::silu_mul_avx512;
    t.rmsnorm_rows = act::rmsnorm_rows_avx512;
    t.gelu_mul = act::gelu_mul_avx512;
    t.rope = act::rope_avx512;
    t.lora_up = lora::up_avx512;
    t.lora_up_f16 = lora::up_f16_avx512;
    t.lora_up_bf16 = lora::up_bf16_avx512;
    return t;
  }();
  return k;
}

const Kernels& table_for(Isa isa) {
  switch (isa) {
    case Isa::avx512: return avx512_table();
    case Isa::avx2: return avx2_table();
    case Isa::scalar: break;
  }
  return scalar_table();
}

std::atomic<const Kernels*> g_chosen{nullptr};

}  // namespace

namespace {
thread_local ReadAhead* current_read_ahead = nullptr;
}  // namespace

void set_read_ahead(ReadAhead* r) { current_read_ahead = r; }
ReadAhead* read_ahead() { return current_read_ahead; }

const Kernels& kernels() {
  // Hot (the scalar f16 conversions come through here per value): after the
  // first call this is one relaxed load.
  const Kernels* t = g_chosen.load(std::memory_order_relaxed);
  if (t == nullptr) {
    const Kernels* best = &table_for(detect_isa());
    if (!g_chosen.compare_exchange_strong(t, best, std::memory_order_relaxed)) return *t;  // set_isa won
    t = best;
  }
  return *t;
}

const Kernels& scalar_kernels() { return scalar_table(); }

Isa active_isa() { return kernels().isa; }

void set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detect_isa()))
    throw std::invalid_argument(std::string("this CPU does not support the ") + isa_name(isa) + " path");
  g_chosen.store(&table_for(isa), std::memory_order_relaxed);
}

}  // namespace ctx
