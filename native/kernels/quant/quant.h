// Weight and activation formats, and the dot-product kernels every matmul and
// attention step is built from.
//
// DETERMINISM CONTRACT. Each kernel below has ONE canonical reduction order,
// written out here. The scalar, AVX2 and AVX-512 paths all follow it exactly
// (explicit FMAs where it says fma, plain mul/add where it says so; the build
// uses -ffp-contract=off), so the three paths give bit-identical results and a
// result never depends on the thread count or on how many rows are computed
// together. tests/test_kernels.py checks every path against scalar, bit for bit.
//
// "hsum16(a)" is the canonical horizontal sum of 16 float lanes:
//   for w in (8, 4, 2, 1): a[i] = a[i] + a[i + w] for i < w;  result a[0].
#pragma once

#include <cstddef>
#include <cstdint>

namespace ctx {

// GGML type ids, as stored in GGUF tensor infos.
enum class DType : int {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

constexpr int QK = 32;     // elements per quant block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8A)
constexpr int QK_K = 256;  // elements per super-block (the K-quants and Q8K)

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };              // x = d * (q - 8); q in 0..15
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };  // x = d * q + m
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };               // x = d * q
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };              // x = d * (q - 16); q in 0..31
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };  // x = d * q + m
// K-quants: super-blocks of 256 with sub-block scales (ggml's layouts).
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
// An activation row quantized for the K-quant dot products (also a weight
// type, Q8_K): ggml's block_q8_K and quantize_row_q8_K, bit for bit:
//   max = the x[j] of largest |x[j]| (the first such); all zero: d = 0, qs = 0, bsums = 0
//   iscale = -127 / max;  qs[j] = min(127, nearbyint(iscale * x[j]));  d = 1 / iscale
//   bsums[g] = sum of qs[16g .. 16g + 15]
struct BlockQ8K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
#pragma pack(pop)
// Nibble layout of Q4_* and Q5_*: qs[j] & 0xF is element j, qs[j] >> 4 is
// element j + 16; Q5_*: bit e of the little-endian qh is bit 4 of element e.
// d and m are IEEE half floats. The K-quant bit layouts are ggml's
// (ggml-common.h); dequantize_row spells each one out.

// An activation row quantized for integer dot products, with the numerics of
// ggml's Q8_0 / Q8_1 blocks (whose scales are f16), because llama.cpp's logits
// are the reference we are held to and the scale rounding moves them:
//   d  = amax / 127, id = amax != 0 ? 127 / amax : 0
//   qs[j] = nearbyint(x[j] * id)               (round half to even)
//   s  = f16(d * (float)sum(qs));  then d = f16(d)   (values rounded to f16, kept as float)
struct BlockQ8A { float d; float s; int8_t qs[32]; };

bool dtype_supported(int ggml_type);
const char* dtype_name(int ggml_type);            // "Q4_1", ... or "type 12"
size_t dtype_row_bytes(DType t, int64_t n);       // bytes of a row of n elements (n % block == 0)
int dtype_block_elems(DType t);                   // 1 for float types, 32 or 256 for block types

// IEEE half / bfloat16 <-> float, exact (round-to-nearest-even on the way down).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);

// x: n floats (n % 32 == 0) -> n / 32 blocks. Canonical definition above.
void quantize_row_q8a(const float* x, BlockQ8A* y, int n);
// x: n floats (n % 256 == 0) -> n / 256 blocks. Definition at BlockQ8K.
void quantize_row_q8k(const float* x, BlockQ8K* y, int n);

// Dequantize one row of n elements of type t into floats (embedding lookup).
void dequantize_row(DType t, const void* src, float* dst, int n);

// ---------------------------------------------------------------------------
// Matrix kernels. W is row-major: n_out rows of dtype_row_bytes(t, n_in) bytes.
// Computes Y[r * y_stride + o] = dot(W row o, X row r) for o in [o0, o1) and
// r in [0, n_x). The caller splits [0, n_out) across threads.
//
// Integer types with blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) take Xq:
// n_x rows of n_in / 32 BlockQ8A. Canonical order (ggml's x86 order for
// vec_dot_q4_1_q8_1 / q5_0_q8_0 / q8_0_q8_0, so our logits track llama.cpp's),
// nb = n_in / 32 blocks, 8 float lanes:
//   acc[8] = 0
//   for b in 0..nb-1 (ascending): for lane l in 0..7: j = l * 4
//       isum = sum_{t<4} wq(b, j+t) * xq(b, j+t)            (exact int32)
//       acc[l] = fma(f16(d_w[b]) * d_x[b], (float)isum, acc[l])
//   dot = hsum8(acc)    where hsum8: for w in (4, 2, 1): a[i] = a[i] + a[i + w] for i < w
//   Q4_1, Q5_1: summ = 0; for b in 0..nb-1: summ = fma(f16(m_w[b]), s_x[b], summ); dot = dot + summ
// where wq is the signed weight value: Q4_0: q - 8, Q5_0: q - 16, Q4_1, Q5_1, Q8_0: q.
//
// Float types (F32, F16, BF16) take Xf: n_x rows of n_in floats.
//   acc[16] = 0; for i in 0..n_in-1 (ascending): acc[i % 16] = fma(w[i], x[i], acc[i % 16])
//   dot = hsum16(acc)
// matmul_f also takes Q8_0 weights, each widened to w[i] = f16(d) * q (exact in
// f32) and then in the float order: bit for bit the product with the weights
// dequantized to F32, at a quarter of their bytes (LoRA matrices, lora.h). The
// base weights' Q8_0 goes to matmul_q, against Q8A activations, as llama.cpp's.
//
// K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and Q8_K weights) take Xk: n_x rows
// of n_in / 256 BlockQ8K (y below). Canonical order (ggml's AVX2 vec_dot_*_q8_K),
// nb = n_in / 256 super-blocks, 8 float lanes:
//   acc[8] = 0 (Q5_K also summ = 0)
//   for i in 0..nb-1 (ascending):
//     isum[l] = sum over e in 0..255 with (e % 32) / 4 == l of sc(e) * q(e) * y.qs[e]  - corr[l]  (exact int32)
//     d = y.d * f16(w.d) (Q8_K: y.d * w.d);  dmin = -(y.d * f16(w.dmin))
//     Q2_K: acc[l] = fma(dmin, (float)(m[2l] * y.bsums[2l] + m[2l+1] * y.bsums[2l+1]), acc[l])
//     acc[l] = fma(d, (float)isum[l], acc[l])
//     Q5_K: summ = fma(dmin, (float)(mk[0]+..+mk[3]), summ)
//       where mk[k] = m[2k] * (y.bsums[4k] + y.bsums[4k+1]) + m[2k+1] * (y.bsums[4k+2] + y.bsums[4k+3])
//   dot = hsum8(acc);  Q5_K: dot = dot + summ
// except Q4_K, which follows llama.cpp's x86 order (its weights are repacked
// there; ggml_gemm_q4_K_8x8_q8_K, the prefill path): for k in 0..3 per super-block,
//   acc = fma((float)(sum over e in [64k, 64k + 64) of sc(e) q(e) y.qs[e]), f16(w.d) * y.d, acc)
//   accm = fma((float)mk[k], f16(w.dmin) * y.d, accm);   dot = acc - accm
// (its one-row gemv sums whole super-blocks instead; llama.cpp's results
// depend on the batch there, ours cannot, so we follow the batched path),
// and Q6_K, which follows llama.cpp's x86 tiled K-quant gemm (ggml-cpu/tiled,
// taken for 8 or more activation rows; fewer go to vec_dot): per super-block
//   acc = fma((float)(isum[0] + .. + isum[7]) * f16(w.d), y.d, acc);   dot = acc
// with q(e) the integer weight, sc(e) its sub-block scale, m[s] the sub-block min,
// corr = 0 except Q6_K:
//   Q2_K: q 0..3,   sc = scales[e/16] & 15, m[s] = scales[s] >> 4 (s < 16)
//   Q3_K: q -4..3 (2 low bits, -4 where the hmask bit is clear), sc = 6-bit scale[e/16] - 32
//   Q4_K: q 0..15, Q5_K: q 0..31; sc, m[s] = 6-bit scale / min of sub-block e/32 (s < 8)
//   Q6_K: q 0..63 (the weight is q - 32), sc = scales[e/16] (int8),
//         corr[l] = 32 * (sc[2l] * y.bsums[2l] + sc[2l+1] * y.bsums[2l+1])
//   Q8_K: q = qs[e] (int8), sc = 1
// (The integer lanes are exact however they are summed; the paths are free to
// do it in any order as long as each lane gets exactly these integers.)
//
// The prefill tiles lay the activation rows out for themselves before they
// multiply; x_id lets a thread keep that layout for the next call: calls with
// the same nonzero x_id promise the same Xq rows (the caller takes a fresh id
// from new_activation_id() whenever the rows change), 0 promises nothing.
// The results are the same bits either way.
void matmul_q(DType t, const void* W, int n_in, int o0, int o1,
              const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride, uint64_t x_id = 0);
uint64_t new_activation_id();  // unique in the process, never 0

// Weights repacked for one activation row ("x8"), for the blocks-of-32
// types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). Decode reads every weight once, from
// memory: in the file's row-major layout a kernel that keeps 8 rows' sums
// going reads 8 streams a row apart, a block from each in turn, and on Zen 4
// that ran at 0.55-0.65x the rate of the same bytes read in address order.
// Repacked, the rows go in groups of 8, and each group block by block: the 8
// rows' f16 d (16 bytes), then their m (Q4_1, Q5_1: 16 bytes), their qh
// (Q5_*: 8 x 4 bytes), and their qs (8 x 16, Q8_0 8 x 32). A group's block
// holds the same bytes as the 8 rows' blocks, so the size is the file's
// (n_out rounded up to 8: the last group's missing rows are zeros, never
// read back). The arithmetic is matmul_q's, lane for lane: the same bits.
bool dtype_has_x8(DType t);
size_t x8_bytes(DType t, int n_in, int n_out);
// Groups [g0, g1) of the n_out x n_in matrix W of type t into P (x8_bytes).
void repack_x8(DType t, const void* W, int n_in, int n_out, int g0, int g1, void* P);
// matmul_q(t, W, ...) where P is W repacked: one or two activation rows'
// whole groups go to the path's kernel for P (Kernels::matvec_x8) where it
// has one; more rows, rows outside whole groups, and paths without one read
// W. (From 3 rows on the batched kernels are bound by arithmetic more than by
// the reading: a version of quant_rows_avx512.cpp over repacked Q8_0 ran at
// 0.8-0.95x its speed over the rows, and the copies' own kernel at 3 and 4
// rows 1.01-1.07x and 0.95x: docs/PERFORMANCE.md, session 43.)
void matmul_x8(DType t, const void* W, const void* P, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
               size_t y_stride, uint64_t x_id = 0);

void matmul_k(DType t, const void* W, int n_in, int o0, int o1,
              const BlockQ8K* Xk, int n_x, float* Y, size_t y_stride);
void matmul_f(DType t, const void* W, int n_in, int o0, int o1,
              const float* Xf, int n_x, float* Y, size_t y_stride);
// The activations llama.cpp multiplies F16 / BF16 weights by: ggml converts
// them to the weight's type first (its vec_dot_type; ggml-cpu.c
// ggml_compute_forward_mul_mat), so the base model's F16 / BF16 matmuls take
// Xf rows rounded by these, each value independently (y may be x):
//   f16:  round to nearest even as F16C's vcvtps2ph (imm 0): ggml_cpu_fp32_to_fp16;
//         past 65504 + half an ulp -> inf, f16 subnormals kept, NaN -> sign | 0x7E00 | (mantissa >> 13)
//   bf16: ggml_compute_fp32_to_bf16: NaN -> (u | 0x00400000) & 0xFFFF0000 (quiet),
//         else (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000 (nearest even; carries to inf; subnormals kept)
// and widened back to f32 (exact).
void round_row_f16(const float* x, float* y, int n);
void round_row_bf16(const float* x, float* y, int n);
// Which activation format a weight type's matmul takes.
enum class ActFormat { f32, q8a, q8k };
ActFormat dtype_act_format(DType t);
bool dtype_is_quantized(DType t);  // true for the matmul_q types (act format q8a)
bool dtype_is_kquant(DType t);     // true for the matmul_k types (act format q8k)

// ---------------------------------------------------------------------------
// KV writes (the attention kernels themselves are in kernels/attention/attention.h).
// Round n floats to f16.
void f32_to_f16_row(const float* x, uint16_t* y, int n);

// n floats (n % 32 == 0) -> n int8 values qs and n / 32 f16 scales d, one per
// block of 32, with BlockQ8A's numerics (ggml q8_0 on x86):
//   amax = max |x[j]|;  d = f16(amax / 127);  qs[j] = nearbyint(x[j] * (amax != 0 ? 127 / amax : 0))
// (round half to even). The value is then d * qs[j], exact in f32.
void quantize_row_kv8(const float* x, int8_t* qs, uint16_t* d, int n);

}  // namespace ctx
