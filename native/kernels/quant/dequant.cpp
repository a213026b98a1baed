// Dequantization of one row (embedding lookups). The float operations are
// those of gguf.quants (and of ggml-base's dequantize_row_*, which are not
// fused): scales first (d * sc, dmin * m), then value * scale - min, each
// rounded, so our embedding rows are bit-identical to both.
#include <cstring>

#include "kernels/quant/quant.h"
#include "kernels/quant/quant_impl.h"

namespace ctx {

namespace {

template <class B>
const B* blocks(const void* src) {
  return static_cast<const B*>(src);
}

void dequant_q4(const BlockQ4_0* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK) {
    const float d = f16_to_f32(blk[b].d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((blk[b].qs[j] & 0xF) - 8);
      dst[j + 16] = d * static_cast<float>((blk[b].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK) {
    const float d = f16_to_f32(blk[b].d), m = f16_to_f32(blk[b].m);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(blk[b].qs[j] & 0xF) + m;
      dst[j + 16] = d * static_cast<float>(blk[b].qs[j] >> 4) + m;
    }
  }
}

void dequant_q5_0(const BlockQ5_0* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK) {
    const float d = f16_to_f32(blk[b].d);
    for (int j = 0; j < QK; ++j) dst[j] = d * static_cast<float>(qk::q5_value(blk[b], j) - 16);
  }
}

void dequant_q5_1(const BlockQ5_1* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK) {
    const float d = f16_to_f32(blk[b].d), m = f16_to_f32(blk[b].m);
    for (int j = 0; j < QK; ++j) dst[j] = d * static_cast<float>(qk::q5_value(blk[b], j)) + m;
  }
}

void dequant_q8_0(const BlockQ8_0* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK) {
    const float d = f16_to_f32(blk[b].d);
    for (int j = 0; j < QK; ++j) dst[j] = d * static_cast<float>(blk[b].qs[j]);
  }
}

// Element e of a super-block: e / 128 picks the 32-byte group of 2-bit
// fields, (e % 128) / 32 the field, e % 32 the byte.
int q2_low(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

void dequant_q2_k(const BlockQ2_K* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK_K) {
    const float d = f16_to_f32(blk[b].d), dmin = f16_to_f32(blk[b].dmin);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(blk[b].scales[s] & 0xF);
      const float ml = dmin * static_cast<float>(blk[b].scales[s] >> 4);
      for (int e = 16 * s; e < 16 * s + 16; ++e) dst[e] = dl * static_cast<float>(q2_low(blk[b].qs, e)) - ml;
    }
  }
}

void dequant_q3_k(const BlockQ3_K* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK_K) {
    const float d = f16_to_f32(blk[b].d);
    uint8_t sc[16];
    qk::unpack_q3k_scales(blk[b].scales, sc);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(sc[s] - 32);
      for (int e = 16 * s; e < 16 * s + 16; ++e) {
        const int high = (blk[b].hmask[e % 32] >> (e / 32)) & 1;
        dst[e] = dl * static_cast<float>(q2_low(blk[b].qs, e) - (high ? 0 : 4));
      }
    }
  }
}

// Q4_K / Q5_K: element e is in the nibble (e % 64) / 32 of byte 32 * (e / 64) + e % 32.
template <class B>
void dequant_k4(const B* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK_K) {
    const float d = f16_to_f32(blk[b].d), dmin = f16_to_f32(blk[b].dmin);
    uint8_t sc[8], m[8];
    qk::unpack_k4_scales(blk[b].scales, sc, m);
    for (int s = 0; s < 8; ++s) {
      const float dl = d * static_cast<float>(sc[s]), ml = dmin * static_cast<float>(m[s]);
      for (int e = 32 * s; e < 32 * s + 32; ++e) {
        int q = (blk[b].qs[32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 0xF;
        if constexpr (sizeof(B) == sizeof(BlockQ5_K)) q |= ((blk[b].qh[e % 32] >> (e / 32)) & 1) << 4;
        dst[e] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Q6_K: element e is low nibble (quarter 0, 1) or high nibble (2, 3) of
// ql[64 * (e / 128) + 32 * (quarter & 1) + e % 32], bits 2 * quarter of qh[32 * (e / 128) + e % 32].
int q6_value(const BlockQ6_K& b, int e) {
  const int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
  const int low = (b.ql[64 * half + 32 * (quarter & 1) + l] >> (4 * (quarter >> 1))) & 0xF;
  const int high = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
  return low | (high << 4);
}

void dequant_q6_k(const BlockQ6_K* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK_K) {
    const float d = f16_to_f32(blk[b].d);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(blk[b].scales[s]);
      for (int e = 16 * s; e < 16 * s + 16; ++e) dst[e] = dl * static_cast<float>(q6_value(blk[b], e) - 32);
    }
  }
}

void dequant_q8_k(const BlockQ8K* blk, int nb, float* dst) {
  for (int b = 0; b < nb; ++b, dst += QK_K)
    for (int e = 0; e < QK_K; ++e) dst[e] = blk[b].d * static_cast<float>(blk[b].qs[e]);
}

}  // namespace

namespace qk {
int q6k_value(const BlockQ6_K& b, int e) { return q6_value(b, e); }
int q2_low_bits(const uint8_t* qs, int e) { return q2_low(qs, e); }
}  // namespace qk

void dequantize_row(DType t, const void* src, float* dst, int n) {
  const int nb = n / dtype_block_elems(t);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n)); return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q4_0: return dequant_q4(blocks<BlockQ4_0>(src), nb, dst);
    case DType::Q4_1: return dequant_q4_1(blocks<BlockQ4_1>(src), nb, dst);
    case DType::Q5_0: return dequant_q5_0(blocks<BlockQ5_0>(src), nb, dst);
    case DType::Q5_1: return dequant_q5_1(blocks<BlockQ5_1>(src), nb, dst);
    case DType::Q8_0: return dequant_q8_0(blocks<BlockQ8_0>(src), nb, dst);
    case DType::Q2_K: return dequant_q2_k(blocks<BlockQ2_K>(src), nb, dst);
    case DType::Q3_K: return dequant_q3_k(blocks<BlockQ3_K>(src), nb, dst);
    case DType::Q4_K: return dequant_k4(blocks<BlockQ4_K>(src), nb, dst);
    case DType::Q5_K: return dequant_k4(blocks<BlockQ5_K>(src), nb, dst);
    case DType::Q6_K: return dequant_q6_k(blocks<BlockQ6_K>(src), nb, dst);
    case DType::Q8_K: return dequant_q8_k(blocks<BlockQ8K>(src), nb, dst);
  }
  throw qk::unsupported_type(t);
}

}  // namespace ctx
