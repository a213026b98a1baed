// AVX-512 float matmul (F32, F16, BF16 weights against float activations)
// and the f16 rounding of KV rows, in the orders of quant.h.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/quant/quant_impl.h"
#include "kernels/quant/simd_common.h"

namespace ctx::qk {

namespace {

constexpr int kTile = 4;  // max weight rows and activation rows per tile

// hsum16: the w = 8 step adds the two halves, the rest is hsum8.
float hsum16_ps(__m512 a) { return hsum8_ps(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))); }

// ---------------------------------------------------------------------------
// Float matmul: acc[i % 16] = fma(w[i], x[i], acc[i % 16]), one zmm per pair.

// 16 weights as floats from an element buffer (f32, f16 or bf16 bits), or from
// a Q8_0 row's blocks widened exactly (quant.h); i % 16 == 0, within one block.
template <DType T>
__m512 load_w16(const void* row, int i) {
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + i);
  } else if constexpr (T == DType::Q8_0) {
    const auto* b = static_cast<const uint8_t*>(row) + static_cast<size_t>(i / QK) * sizeof(BlockQ8_0);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + i % QK));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(_cvtsh_ss(load_u16(b))));
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
  if (const int rest = n_in - n16; T != DType::Q8_0 && rest) {  // Q8_0 rows are whole blocks of 32
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
  const size_t row_bytes = dtype_row_bytes(T, n_in);
  const auto* wbase = static_cast<const uint8_t*>(W);
  for (int o = o0; o < o1; o += kTile) {
    const int nw = std::min(kTile, o1 - o);
    for (int r = 0; r < n_x; r += kTile)
      pick_tile_f<T>(nw, std::min(kTile, n_x - r))(wbase + o * row_bytes, row_bytes, n_in,
                                                   Xf + static_cast<size_t>(r) * n_in, Y + r * y_stride + o, y_stride);
  }
}

}  // namespace

void matmul_f_avx512(DType t, const void* W, int n_in, int o0, int o1, const float* Xf, int n_x, float* Y,
                     size_t y_stride) {
  switch (t) {
    case DType::F32: return matmul_f_impl<DType::F32>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::F16: return matmul_f_impl<DType::F16>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    case DType::BF16: return matmul_f_impl<DType::BF16>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
    default: return matmul_f_impl<DType::Q8_0>(W, n_in, o0, o1, Xf, n_x, Y, y_stride);
  }
}

// ---------------------------------------------------------------------------
// Attention helpers

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
