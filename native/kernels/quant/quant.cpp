// Format helpers, the scalar reference kernels and the run-time dispatch.
//
// The scalar kernels are written as literally as possible from the canonical
// orders in quant.h: they are the definition the SIMD paths are tested
// against, bit for bit, so clarity beats speed here.
#include "kernels/quant/quant.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cpu.h"
#include "kernels/kernels.h"
#include "kernels/quant/quant_impl.h"

namespace ctx {

using qk::hsum16;
using qk::hsum8;

// ---------------------------------------------------------------------------
// Type table

bool dtype_supported(int ggml_type) {
  switch (static_cast<DType>(ggml_type)) {
    case DType::F32:
    case DType::F16:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
    case DType::BF16: return true;
  }
  return false;
}

const char* dtype_name(int ggml_type) {
  switch (static_cast<DType>(ggml_type)) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q5_1: return "Q5_1";
    case DType::Q8_0: return "Q8_0";
    case DType::Q2_K: return "Q2_K";
    case DType::Q3_K: return "Q3_K";
    case DType::Q4_K: return "Q4_K";
    case DType::Q5_K: return "Q5_K";
    case DType::Q6_K: return "Q6_K";
    case DType::Q8_K: return "Q8_K";
    case DType::BF16: return "BF16";
  }
  // Unknown ids get a per-thread buffer: the pointer stays valid until this
  // thread's next call with an unknown id, which is enough for error messages.
  thread_local std::string unknown;
  unknown = "type " + std::to_string(ggml_type);
  return unknown.c_str();
}

std::invalid_argument qk::unsupported_type(DType t) {
  return std::invalid_argument(std::string("unsupported tensor type ") + dtype_name(static_cast<int>(t)));
}
static std::invalid_argument unsupported(DType t) { return qk::unsupported_type(t); }

ActFormat dtype_act_format(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return ActFormat::f32;
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0: return ActFormat::q8a;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K: return ActFormat::q8k;
  }
  throw unsupported(t);
}

int dtype_block_elems(DType t) {
  switch (dtype_act_format(t)) {
    case ActFormat::f32: return 1;
    case ActFormat::q8a: return QK;
    case ActFormat::q8k: return QK_K;
  }
  throw unsupported(t);
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const auto blocks = static_cast<size_t>(n / dtype_block_elems(t));
  switch (t) {
    case DType::F32: return 4 * static_cast<size_t>(n);
    case DType::F16:
    case DType::BF16: return 2 * static_cast<size_t>(n);
    case DType::Q4_0: return blocks * qk::kQ4_0Bytes;
    case DType::Q4_1: return blocks * qk::kQ4_1Bytes;
    case DType::Q5_0: return blocks * sizeof(BlockQ5_0);
    case DType::Q5_1: return blocks * sizeof(BlockQ5_1);
    case DType::Q8_0: return blocks * qk::kQ8_0Bytes;
    case DType::Q2_K: return blocks * sizeof(BlockQ2_K);
    case DType::Q3_K: return blocks * sizeof(BlockQ3_K);
    case DType::Q4_K: return blocks * sizeof(BlockQ4_K);
    case DType::Q5_K: return blocks * sizeof(BlockQ5_K);
    case DType::Q6_K: return blocks * sizeof(BlockQ6_K);
    case DType::Q8_K: return blocks * sizeof(BlockQ8K);
  }
  throw unsupported(t);
}

bool dtype_is_quantized(DType t) { return dtype_supported(static_cast<int>(t)) && dtype_act_format(t) == ActFormat::q8a; }
bool dtype_is_kquant(DType t) { return dtype_supported(static_cast<int>(t)) && dtype_act_format(t) == ActFormat::q8k; }

// ---------------------------------------------------------------------------
// Half / bfloat16 conversions. NaNs follow what F16C does, so the scalar path
// matches the SIMD paths bit for bit: both directions return a quiet NaN that
// keeps the top payload bits (numpy keeps signalling NaNs signalling instead).

static uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

float qk::f16_to_f32_soft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000 | (man ? 0x400000 : 0) | (man << 13));
  if (exp == 0) {
    // Subnormal (or zero): man * 2^-24 is exact in float.
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return bits_float(sign | float_bits(mag));
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

// Round-to-nearest-even of `value >> shift` (shift >= 1).
static uint32_t shift_round_even(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

uint16_t qk::f32_to_f16_soft(float f) {
  const uint32_t u = float_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00 | ((a >> 13) & 0x3FF));  // NaN
  if (a >= 0x47800000) return static_cast<uint16_t>(sign | 0x7C00);  // >= 65536 (and Inf): Inf
  if (a >= 0x38800000) {
    // Normal half range: rebias the exponent (127 -> 15) and round away 13
    // mantissa bits. A carry out of the mantissa bumps the exponent, which is
    // the right answer, up to Inf for [65520, 65536).
    return static_cast<uint16_t>(sign | shift_round_even(a - 0x38000000, 13));
  }
  if (a <= 0x33000000) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie, to even)
  // Half subnormal: value = m * 2^(e - 150), in units of 2^-24 that is m >> (126 - e).
  const int e = static_cast<int>(a >> 23);
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  return static_cast<uint16_t>(sign | shift_round_even(m, 126 - e));
}

// One F16C instruction each: what the hot scalar callers (the GELU table
// lookups, KV writes) want. Bit-identical to the software versions above, which
// the scalar path keeps using so the tests still check them against numpy.
__attribute__((target("f16c"))) float qk::f16_to_f32_hw(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t qk::f32_to_f16_hw(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

float f16_to_f32(uint16_t h) { return kernels().f16_to_f32(h); }
uint16_t f32_to_f16(float f) { return kernels().f32_to_f16(f); }

float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// ---------------------------------------------------------------------------
// Activation quantization. The scalar definitions below; the SIMD paths
// produce the same bytes (q8a_avx2.cpp, q8a_avx512.cpp: prefill quantizes
// every row before each matmul, a few percent of its time on one scalar lane),
// so Q8A bytes never depend on the ISA. The KV quantizer stays scalar.

// nearbyint (round half to even in the default rounding mode) for |v| <= 2^22
// without a libm call: adding 1.5 * 2^23 leaves no fraction bits, so the add
// itself rounds, and subtracting it back is exact.
int qk::round_half_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return static_cast<int>((v + kMagic) - kMagic);
}

static float round_to_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// One block of 32: qs[j] = round(x[j] * 127 / amax); returns d = amax / 127
// (not yet rounded to f16). Shared by the activation and the KV quantizers.
static float quantize_block_q8(const float* xb, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(xb[j]));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < QK; ++j) qs[j] = static_cast<int8_t>(qk::round_half_even(xb[j] * id));
  return amax / 127.0f;
}

void quantize_row_q8a(const float* x, BlockQ8A* y, int n) { kernels().quantize_row_q8a(x, y, n); }

void qk::quantize_row_q8a_scalar(const float* x, BlockQ8A* y, int n) {
  for (int b = 0; b < n / QK; ++b) {
    const float d = quantize_block_q8(x + b * QK, y[b].qs);
    int sum = 0;
    for (int j = 0; j < QK; ++j) sum += y[b].qs[j];
    y[b].s = round_to_f16(d * static_cast<float>(sum));
    y[b].d = round_to_f16(d);
  }
}

void quantize_row_kv8(const float* x, int8_t* qs, uint16_t* d, int n) {
  for (int b = 0; b < n / QK; ++b) d[b] = f32_to_f16(quantize_block_q8(x + b * QK, qs + b * QK));
}

// ---------------------------------------------------------------------------
// Scalar reference kernels.

namespace {

// Signed weight value of element j (0..31) of a block, and the block's scales.
struct Q4_0Traits {
  using Block = BlockQ4_0;
  static int wq(const Block& b, int j) { return (j < 16 ? b.qs[j] & 0xF : b.qs[j - 16] >> 4) - 8; }
};
struct Q4_1Traits {
  using Block = BlockQ4_1;
  static int wq(const Block& b, int j) { return j < 16 ? b.qs[j] & 0xF : b.qs[j - 16] >> 4; }
};
struct Q5_0Traits {
  using Block = BlockQ5_0;
  static int wq(const Block& b, int j) { return qk::q5_value(b, j) - 16; }
};
struct Q5_1Traits {
  using Block = BlockQ5_1;
  static int wq(const Block& b, int j) { return qk::q5_value(b, j); }
};
struct Q8_0Traits {
  using Block = BlockQ8_0;
  static int wq(const Block& b, int j) { return b.qs[j]; }
};

template <class T>
float dot_q_scalar(const typename T::Block* w, const BlockQ8A* x, int nb) {
  float acc[8] = {};
  for (int b = 0; b < nb; ++b) {
    const float scale = f16_to_f32(w[b].d) * x[b].d;
    for (int l = 0; l < 8; ++l) {
      const int j = l * 4;
      int32_t isum = 0;
      for (int t = 0; t < 4; ++t) isum += T::wq(w[b], j + t) * x[b].qs[j + t];
      acc[l] = std::fma(scale, static_cast<float>(isum), acc[l]);
    }
  }
  float dot = hsum8(acc);
  if constexpr (std::is_same_v<T, Q4_1Traits> || std::is_same_v<T, Q5_1Traits>) {
    float summ = 0.0f;
    for (int b = 0; b < nb; ++b) summ = std::fma(f16_to_f32(w[b].m), x[b].s, summ);
    dot = dot + summ;
  }
  return dot;
}

template <class T>
void matmul_q_rows(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                     size_t y_stride) {
  const int nb = n_in / QK;
  const auto* rows = static_cast<const typename T::Block*>(W);
  for (int o = o0; o < o1; ++o)
    for (int r = 0; r < n_x; ++r)
      Y[r * y_stride + o] = dot_q_scalar<T>(rows + static_cast<size_t>(o) * nb, Xq + static_cast<size_t>(r) * nb, nb);
}

// One weight of a float-activation row, by index: f32, f16 or bf16 elements, or
// a Q8_0 row's blocks widened exactly (d * q needs 19 of f32's 24 bits).
float load_f32(const uint8_t* w, int i) { return reinterpret_cast<const float*>(w)[i]; }
float load_f16(const uint8_t* w, int i) { return f16_to_f32(reinterpret_cast<const uint16_t*>(w)[i]); }
float load_bf16(const uint8_t* w, int i) { return bf16_to_f32(reinterpret_cast<const uint16_t*>(w)[i]); }
float load_q8_0(const uint8_t* w, int i) {
  const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(w)[i / QK];
  return f16_to_f32(b.d) * static_cast<float>(b.qs[i % QK]);
}

template <float (*Load)(const uint8_t*, int)>
void matmul_f_rows(const void* W, size_t row_bytes, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                   size_t y_stride) {
  for (int o = o0; o < o1; ++o) {
    const uint8_t* w = static_cast<const uint8_t*>(W) + static_cast<size_t>(o) * row_bytes;
    for (int r = 0; r < n_x; ++r) {
      const float* x = Xf + static_cast<size_t>(r) * n_in;
      float acc[16] = {};
      for (int i = 0; i < n_in; ++i) acc[i % 16] = std::fma(Load(w, i), x[i], acc[i % 16]);
      Y[r * y_stride + o] = hsum16(acc);
    }
  }
}

void f32_to_f16_row_each(const float* x, uint16_t* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

}  // namespace

void qk::matmul_q_scalar(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                         size_t y_stride, uint64_t /*x_id: nothing to keep*/) {
  switch (t) {
    case DType::Q4_0: return matmul_q_rows<Q4_0Traits>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q4_1: return matmul_q_rows<Q4_1Traits>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_0: return matmul_q_rows<Q5_0Traits>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q5_1: return matmul_q_rows<Q5_1Traits>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    default: return matmul_q_rows<Q8_0Traits>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
  }
}

void qk::matmul_f_scalar(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                         size_t y_stride) {
  const size_t row_bytes = dtype_row_bytes(t, n_in);
  switch (t) {
    case DType::F32: return matmul_f_rows<load_f32>(W, row_bytes, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::F16: return matmul_f_rows<load_f16>(W, row_bytes, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::BF16: return matmul_f_rows<load_bf16>(W, row_bytes, n_in, o0, o1, Xf, n_x, Y, y_stride);
    default: return matmul_f_rows<load_q8_0>(W, row_bytes, n_in, o0, o1, Xf, n_x, Y, y_stride);
  }
}

void qk::f32_to_f16_row_scalar(const float* x, uint16_t* y, int n) { f32_to_f16_row_each(x, y, n); }

namespace {
std::atomic<int> g_prefill_tiles{-1};  // -1: not chosen yet
}  // namespace

qk::PrefillTiles qk::prefill_tiles() {
  int t = g_prefill_tiles.load(std::memory_order_relaxed);
  if (t < 0) {
    const int best = static_cast<int>(whole_512_bit_units() ? PrefillTiles::zmm : PrefillTiles::ymm);
    if (g_prefill_tiles.compare_exchange_strong(t, best, std::memory_order_relaxed)) t = best;  // else: set won
  }
  return static_cast<PrefillTiles>(t);
}

void qk::set_prefill_tiles(PrefillTiles tiles) { g_prefill_tiles.store(static_cast<int>(tiles), std::memory_order_relaxed); }

namespace {
std::atomic<bool> g_avx2_vnni{has_avx_vnni()};
}  // namespace

bool qk::avx2_vnni() { return g_avx2_vnni.load(std::memory_order_relaxed); }

void qk::set_avx2_vnni(bool on) {
  if (on && !has_avx_vnni()) throw std::invalid_argument("this CPU has no AVX-VNNI");
  g_avx2_vnni.store(on, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------
// The public entry points: check the type, then the chosen path's kernel.

void matmul_q(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
              size_t y_stride, uint64_t x_id) {
  if (!dtype_is_quantized(t)) throw unsupported(t);
  kernels().matmul_q(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
}

uint64_t new_activation_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void matmul_f(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
              size_t y_stride) {
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0) throw unsupported(t);
  kernels().matmul_f(t, W, n_in, o0, o1, Xf, n_x, Y, y_stride);
}

void f32_to_f16_row(const float* x, uint16_t* y, int n) { kernels().f32_to_f16_row(x, y, n); }

}  // namespace ctx
