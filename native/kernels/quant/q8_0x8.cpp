// Q8_0 weights repacked for one-row products, 8 rows to a group (quant.h,
// "Q8_0 x8"): the repacking, and the matmul that sends one activation row's
// whole groups to the path's kernel for the layout, and the rest to matmul_q.
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"

namespace ctx {

namespace {

constexpr int kGroup = 8;                        // rows a group
constexpr size_t kBlock = sizeof(BlockQ8_0);     // 34 bytes: f16 d, 32 qs
constexpr size_t kGroupBlock = kGroup * kBlock;  // a group's block b: 8 d, then 8 x 32 qs

}  // namespace

size_t q8_0x8_bytes(int n_in, int n_out) {
  const size_t groups = (static_cast<size_t>(n_out) + kGroup - 1) / kGroup;
  return groups * (static_cast<size_t>(n_in) / QK) * kGroupBlock;
}

void repack_q8_0x8(const void* W, int n_in, int n_out, int g0, int g1, void* P) {
  const size_t nb = static_cast<size_t>(n_in) / QK, row_bytes = nb * kBlock;
  const auto* w = static_cast<const uint8_t*>(W);
  auto* p = static_cast<uint8_t*>(P);
  for (int g = g0; g < g1; ++g) {
    uint8_t* dst = p + static_cast<size_t>(g) * nb * kGroupBlock;
    for (size_t b = 0; b < nb; ++b, dst += kGroupBlock)
      for (int j = 0; j < kGroup; ++j) {
        const int o = g * kGroup + j;
        if (o < n_out) {
          const uint8_t* src = w + static_cast<size_t>(o) * row_bytes + b * kBlock;
          std::memcpy(dst + 2 * j, src, 2);
          std::memcpy(dst + 2 * kGroup + QK * j, src + 2, QK);
        } else {  // past the last row: zeros
          std::memset(dst + 2 * j, 0, 2);
          std::memset(dst + 2 * kGroup + QK * j, 0, QK);
        }
      }
  }
}

void matmul_q8_0x8(const void* W, const void* P, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
                   size_t y_stride, uint64_t x_id) {
  const auto matvec = kernels().matvec_q8_0x8;
  const int g0 = (o0 + kGroup - 1) / kGroup, g1 = o1 / kGroup;
  if (n_x != 1 || matvec == nullptr || g0 >= g1)
    return matmul_q(DType::Q8_0, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  // A range that starts or ends inside a group takes those rows from W.
  if (o0 < g0 * kGroup) matmul_q(DType::Q8_0, W, n_in, o0, g0 * kGroup, Xq, 1, Y, y_stride, x_id);
  matvec(P, n_in, g0, g1, Xq, Y);
  if (g1 * kGroup < o1) matmul_q(DType::Q8_0, W, n_in, g1 * kGroup, o1, Xq, 1, Y, y_stride, x_id);
}

}  // namespace ctx
