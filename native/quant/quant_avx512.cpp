// AVX-512 (VNNI) kernels. One zmm holds exactly the 16 canonical lanes of
// quant.h, and for the integer types one 64-byte vpdpbusd covers a whole
// two-block chunk: int32 lane l sums bytes 4l..4l+3, i.e. lanes 0-7 are the
// first block and lanes 8-15 the second, element j = (l % 8) * 4 + t.
//
// vpdpbusd multiplies UNSIGNED by signed bytes, so the signed weights are
// biased to unsigned (Q4_0: q, whose value is q - 8; Q8_0: q + 128) and the
// bias is taken back exactly in int32 by starting the accumulator at
// -bias * sum(x) over the 4 bytes. The per-lane int32 is then the exact
// canonical isum, whatever the trick.
//
// Tiling: a tile is NW weight rows x NX activation rows (up to 4 x 4). The
// weight nibbles of a chunk are unpacked once into registers and used for all
// NX rows; the activation side is prepared once per batch of rows (prep_x)
// into vectors that the kernel reads as memory operands. Every (o, r) pair still
// has its own accumulator fed in canonical order, so tiling never changes a
// result.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/quant_impl.h"

namespace ctx::qk {

namespace {

constexpr int kTile = 4;  // max weight rows and activation rows per tile

float hsum16_ps(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---------------------------------------------------------------------------
// Integer matmul

// One activation row's share of one two-block chunk, ready for vpdpbusd.
struct XChunk {
  __m512i q;      // the two blocks' 64 int8 (second block zero for a lone last block)
  __m512i nbias;  // -bias * (sum of each 4 bytes), the int32 accumulator start (Q4_0, Q8_0)
  __m512 d;       // d_x of the first block in lanes 0-7, of the second in lanes 8-15
};

// Q4_1's per-block activation sums for one tile of activation rows:
// lane i * 4 + j holds s_x of row j (the pair lane layout of the summ vector).
struct SVec {
  __m512 s;
};

constexpr int weight_bias(DType t) { return t == DType::Q4_0 ? 8 : t == DType::Q8_0 ? 128 : 0; }
constexpr size_t block_bytes(DType t) {
  return t == DType::Q4_0 ? kQ4_0Bytes : t == DType::Q4_1 ? kQ4_1Bytes : kQ8_0Bytes;
}

struct XScratch {
  std::vector<XChunk> chunks;  // [group][chunk][row in group]
  std::vector<SVec> svecs;     // [group][block], Q4_1 only
};

// Prepares activation rows X[0, rows) (rows of nb blocks) into groups of kTile rows.
template <DType T>
void prep_x(const BlockQ8A* X, int nb, int rows, XScratch& xs) {
  const int nc = (nb + 1) / 2, ng = (rows + kTile - 1) / kTile;
  xs.chunks.resize(static_cast<size_t>(ng) * nc * kTile);
  if (T == DType::Q4_1) xs.svecs.resize(static_cast<size_t>(ng) * nb);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(weight_bias(T)));
  for (int r = 0; r < rows; ++r) {
    const BlockQ8A* x = X + static_cast<size_t>(r) * nb;
    XChunk* out = &xs.chunks[(static_cast<size_t>(r / kTile) * nc) * kTile + r % kTile];
    for (int c = 0; c < nc; ++c, out += kTile) {
      const BlockQ8A& b0 = x[2 * c];
      const bool pair = 2 * c + 1 < nb;
      const __m256i q1 = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[2 * c + 1].qs))
                              : _mm256_setzero_si256();
      out->q = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0.qs))), q1, 1);
      if (T != DType::Q4_1)
        out->nbias = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, out->q));
      out->d = _mm512_insertf32x8(_mm512_set1_ps(b0.d), _mm256_set1_ps(pair ? x[2 * c + 1].d : 0.0f), 1);
    }
  }
  if (T == DType::Q4_1) {
    for (int g = 0; g < ng; ++g) {
      const int g_rows = std::min(kTile, rows - g * kTile);
      for (int b = 0; b < nb; ++b) {
        alignas(64) float s[16] = {};
        for (int j = 0; j < g_rows; ++j) {
          const float sx = X[static_cast<size_t>(g * kTile + j) * nb + b].s;
          for (int i = 0; i < kTile; ++i) s[i * kTile + j] = sx;
        }
        xs.svecs[static_cast<size_t>(g) * nb + b].s = _mm512_load_ps(s);
      }
    }
  }
}

// Weight bytes of one chunk of one row: 64 unsigned bytes in element order
// (lanes as the canonical mapping), and its header halves packed as
// (d0, m0, d1, m1) (m = 0 for Q4_0 / Q8_0; second block 0 for a lone block).
template <DType T, bool kLone>
__m512i load_weights(const uint8_t* p, uint64_t& header) {
  constexpr size_t bb = block_bytes(T);
  if constexpr (T == DType::Q8_0) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    const __m256i hi = kLone ? _mm256_setzero_si256() : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + bb + 2));
    header = load_u16(p) | (kLone ? 0 : static_cast<uint64_t>(load_u16(p + bb)) << 32);
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(-128));
  } else {
    // 128-bit lanes [qs0, qs0, qs1, qs1] from two 16-byte loads (never past
    // the chunk: the last row may end the buffer); the odd lanes then take
    // the high nibbles. (Masked loads would do too, but GCC treats them as
    // memory clobbers and then spills every accumulator each chunk.)
    constexpr size_t qs_offset = T == DType::Q4_1 ? 4 : 2;
    const __m512i qs0 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_offset)));
    const __m512i u =
        kLone ? qs0
              : _mm512_mask_broadcast_i32x4(qs0, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + bb + qs_offset)));
    if constexpr (T == DType::Q4_1)
      header = load_u32(p) | (kLone ? 0 : static_cast<uint64_t>(load_u32(p + bb)) << 32);
    else
      header = load_u16(p) | (kLone ? 0 : static_cast<uint64_t>(load_u16(p + bb)) << 32);
    const __m512i shifted = _mm512_srlv_epi64(u, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
  }
}

template <DType T, int NW, int NX, bool kLone>
inline void chunk_step(const uint8_t* const* wrow, size_t offset, const XChunk* xc, const SVec* sv,
                       __m512 (&acc)[NW][NX], __m512& summ) {
  __m512i w[NW];
  uint64_t header[kTile] = {};
  for (int i = 0; i < NW; ++i) w[i] = load_weights<T, kLone>(wrow[i] + offset, header[i]);
  // All the tile's scales in one conversion: H[4i + k] = (d0, m0, d1, m1)[k] of row i.
  const __m512 H = _mm512_cvtph_ps(_mm256_setr_epi64x(static_cast<long long>(header[0]), static_cast<long long>(header[1]),
                                                      static_cast<long long>(header[2]), static_cast<long long>(header[3])));
  for (int i = 0; i < NW; ++i) {
    const __m512 dw = _mm512_permutexvar_ps(
        _mm512_inserti64x4(_mm512_set1_epi32(4 * i), _mm256_set1_epi32(4 * i + 2), 1), H);
    for (int j = 0; j < NX; ++j) {
      const XChunk& x = xc[j];
      const __m512i start = T == DType::Q4_1 ? _mm512_setzero_si512() : x.nbias;
      const __m512 isum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, w[i], x.q));
      const __m512 scale = _mm512_mul_ps(dw, x.d);
      acc[i][j] = kLone ? _mm512_mask3_fmadd_ps(scale, isum, acc[i][j], 0x00FF) : _mm512_fmadd_ps(scale, isum, acc[i][j]);
    }
  }
  if constexpr (T == DType::Q4_1) {
    // summ lane i * 4 + j is pair (i, j): m of row i times s of row j, block by block in order.
    const __m512i m0_idx = _mm512_setr_epi32(1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13);
    summ = _mm512_fmadd_ps(_mm512_permutexvar_ps(m0_idx, H), sv[0].s, summ);
    if (!kLone)
      summ = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_add_epi32(m0_idx, _mm512_set1_epi32(2)), H), sv[1].s, summ);
  }
}

// Y[(r0 + j) * y_stride + o + i] for the tile's NW x NX pairs.
template <DType T, int NW, int NX>
void tile_q(const uint8_t* w0, size_t row_bytes, int nb, const XChunk* xc, const SVec* sv, float* Y,
            size_t y_stride) {
  constexpr size_t chunk_bytes = 2 * block_bytes(T);
  const uint8_t* wrow[NW];
  for (int i = 0; i < NW; ++i) wrow[i] = w0 + i * row_bytes;
  __m512 acc[NW][NX];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  __m512 summ = _mm512_setzero_ps();
  // sv is only there for Q4_1 (null otherwise, so never offset it then).
  auto block_sv = [sv](int b) { return T == DType::Q4_1 ? sv + b : nullptr; };
  const int full = nb / 2;
  for (int c = 0; c < full; ++c)
    chunk_step<T, NW, NX, false>(wrow, c * chunk_bytes, xc + c * kTile, block_sv(2 * c), acc, summ);
  if (nb % 2) chunk_step<T, NW, NX, true>(wrow, full * chunk_bytes, xc + full * kTile, block_sv(2 * full), acc, summ);

  alignas(64) float summ_lanes[16];
  _mm512_store_ps(summ_lanes, summ);
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) {
      float dot = hsum16_ps(acc[i][j]);
      if (T == DType::Q4_1) dot = dot + summ_lanes[i * kTile + j];
      Y[j * y_stride + i] = dot;
    }
}

using TileQFn = void (*)(const uint8_t*, size_t, int, const XChunk*, const SVec*, float*, size_t);

template <DType T, int NW>
TileQFn pick_nx(int nx) {
  switch (nx) {
    case 1: return tile_q<T, NW, 1>;
    case 2: return tile_q<T, NW, 2>;
    case 3: return tile_q<T, NW, 3>;
    default: return tile_q<T, NW, 4>;
  }
}

template <DType T>
TileQFn pick_tile_q(int nw, int nx) {
  switch (nw) {
    case 1: return pick_nx<T, 1>(nx);
    case 2: return pick_nx<T, 2>(nx);
    case 3: return pick_nx<T, 3>(nx);
    default: return pick_nx<T, 4>(nx);
  }
}

// Cache blocking. Activation rows are prepared in batches small enough to
// stay in L2; weight rows are swept in blocks that also fit in L2, and each
// group of 4 activation rows (a few KB, in L1) meets the whole weight block
// before the next group. So weights come from memory once per batch and
// from L2 after that (0.16 bytes per MAC in a 4 x 4 tile), and the prepared
// activations are read from L1.
constexpr size_t kPrepBudget = 256 * 1024;
constexpr size_t kWeightBlockBudget = 256 * 1024;

template <DType T>
void matmul_q_impl(const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y, size_t y_stride) {
  thread_local XScratch xs;
  const int nb = n_in / QK, nc = (nb + 1) / 2;
  const size_t row_bytes = nb * block_bytes(T);
  const size_t prep_row_bytes = nc * sizeof(XChunk) + nb * sizeof(SVec);
  const int batch = std::max<int>(kTile, static_cast<int>(kPrepBudget / prep_row_bytes) / kTile * kTile);
  const int w_block = std::max<int>(kTile, static_cast<int>(kWeightBlockBudget / row_bytes) / kTile * kTile);
  const auto* wbase = static_cast<const uint8_t*>(W);
  for (int r0 = 0; r0 < n_x; r0 += batch) {
    const int rows = std::min(batch, n_x - r0);
    prep_x<T>(Xq + static_cast<size_t>(r0) * nb, nb, rows, xs);
    for (int ob = o0; ob < o1; ob += w_block) {
      const int ob_end = std::min(o1, ob + w_block);
      for (int g = 0; g * kTile < rows; ++g) {
        const int nx = std::min(kTile, rows - g * kTile);
        const XChunk* xc = &xs.chunks[static_cast<size_t>(g) * nc * kTile];
        const SVec* sv = T == DType::Q4_1 ? &xs.svecs[static_cast<size_t>(g) * nb] : nullptr;
        float* y = Y + (r0 + g * kTile) * y_stride;
        for (int o = ob; o < ob_end; o += kTile) {
          const int nw = std::min(kTile, ob_end - o);
          pick_tile_q<T>(nw, nx)(wbase + o * row_bytes, row_bytes, nb, xc, sv, y + o, y_stride);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Float matmul: acc[i % 16] = fma(w[i], x[i], acc[i % 16]), one zmm per pair.

// 16 weights as floats from an element buffer (f32, f16 or bf16 bits).
template <DType T>
__m512 load_w16(const void* row, int i) {
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (T == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16: exact widening
  }
}

template <DType T, int NW, int NX>
void tile_f(const uint8_t* w0, size_t row_bytes, int n_in, const float* x0, float* Y, size_t y_stride) {
  using Elem = std::conditional_t<T == DType::F32, float, uint16_t>;
  __m512 acc[NW][NX];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const int n16 = n_in / 16 * 16;
  for (int e = 0; e < n16; e += 16) {
    __m512 w[NW];
    for (int i = 0; i < NW; ++i) w[i] = load_w16<T>(w0 + i * row_bytes, e);
    for (int j = 0; j < NX; ++j) {
      const __m512 x = _mm512_loadu_ps(x0 + static_cast<size_t>(j) * n_in + e);
      for (int i = 0; i < NW; ++i) acc[i][j] = _mm512_fmadd_ps(w[i], x, acc[i][j]);
    }
  }
  if (const int rest = n_in - n16) {
    // Tail lanes e % 16 < rest get one more fma; the others keep their value.
    // The tail goes through zero-padded copies rather than masked loads: GCC
    // treats masked loads as memory clobbers and would then keep the
    // accumulators in memory through the main loop.
    const auto k = static_cast<__mmask16>((1u << rest) - 1);
    Elem wt[16] = {};
    float xt[16] = {};
    __m512 w[NW];
    for (int i = 0; i < NW; ++i) {
      std::memcpy(wt, reinterpret_cast<const Elem*>(w0 + i * row_bytes) + n16, rest * sizeof(Elem));
      w[i] = load_w16<T>(wt, 0);
    }
    for (int j = 0; j < NX; ++j) {
      std::memcpy(xt, x0 + static_cast<size_t>(j) * n_in + n16, rest * sizeof(float));
      const __m512 x = _mm512_loadu_ps(xt);
      for (int i = 0; i < NW; ++i) acc[i][j] = _mm512_mask3_fmadd_ps(w[i], x, acc[i][j], k);
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < NX; ++j) Y[j * y_stride + i] = hsum16_ps(acc[i][j]);
}

using TileFFn = void (*)(const uint8_t*, size_t, int, const float*, float*, size_t);

template <DType T, int NW>
TileFFn pick_f_nx(int nx) {
  switch (nx) {
    case 1: return tile_f<T, NW, 1>;
    case 2: return tile_f<T, NW, 2>;
    case 3: return tile_f<T, NW, 3>;
    default: return tile_f<T, NW, 4>;
  }
}

template <DType T>
TileFFn pick_tile_f(int nw, int nx) {
  switch (nw) {
    case 1: return pick_f_nx<T, 1>(nx);
    case 2: return pick_f_nx<T, 2>(nx);
    case 3: return pick_f_nx<T, 3>(nx);
    default: return pick_f_nx<T, 4>(nx);
  }
}

template <DType T>
void matmul_f_impl(const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y, size_t y_stride) {
  const size_t row_bytes = static_cast<size_t>(n_in) * (T == DType::F32 ? 4 : 2);
  const auto* wbase = static_cast<const uint8_t*>(W);
  for (int o = o0; o < o1; o += kTile) {
    const int nw = std::min(kTile, o1 - o);
    for (int r = 0; r < n_x; r += kTile)
      pick_tile_f<T>(nw, std::min(kTile, n_x - r))(wbase + o * row_bytes, row_bytes, n_in,
                                                   Xf + static_cast<size_t>(r) * n_in, Y + r * y_stride + o, y_stride);
  }
}

}  // namespace

void matmul_q_avx512(DType t, const void* W, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                     size_t y_stride) {
  switch (t) {
    case DType::Q4_0: return matmul_q_impl<DType::Q4_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    case DType::Q4_1: return matmul_q_impl<DType::Q4_1>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
    default: return matmul_q_impl<DType::Q8_0>(W, n_in, o0, o1, Xq, n_x, Y, y_stride);
  }
}

void matmul_f_avx512(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                     size_t y_stride) {
  switch (t) {
    case DType::F32: return matmul_f_impl<DType::F32>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::F16: return matmul_f_impl<DType::F16>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    default: return matmul_f_impl<DType::BF16>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
  }
}

// ---------------------------------------------------------------------------
// Attention helpers

float dot_f32_f16_avx512(const float* q, const uint16_t* k, int n) {
  __m512 acc = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i),
                          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + i))), acc);
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k + i)),
                                acc, m);
  }
  return hsum16_ps(acc);
}

void axpy_f16_avx512(float a, const uint16_t* v, float* y, int n) {
  const __m512 av = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 vf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, vf, _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 vf = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, v + i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, vf, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void f32_to_f16_row_avx512(const float* x, uint16_t* y, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

}  // namespace ctx::qk
