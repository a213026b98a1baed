// Weights of the blocks-of-32 types repacked 8 rows to a group for decode
// (quant.h, "x8"; the layout: quant_impl.h x8_fields): the repacking, and the
// matmul that sends one or two activation rows' whole groups to the path's
// kernel for the layout and the rest to matmul_q on the rows.
#include <cstring>
#include <utility>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"
#include "kernels/quant/quant_impl.h"

namespace ctx {

using qk::kX8Rows;

bool dtype_has_x8(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0;
}

size_t x8_bytes(DType t, int n_in, int n_out) {
  const size_t groups = (static_cast<size_t>(n_out) + kX8Rows - 1) / kX8Rows;
  return groups * kX8Rows * dtype_row_bytes(t, n_in);
}

void repack_x8(DType t, const void* W, int n_in, int n_out, int g0, int g1, void* P) {
  const size_t nb = static_cast<size_t>(n_in) / QK, row_bytes = dtype_row_bytes(t, n_in), bb = row_bytes / nb;
  const qk::BlockFields from = qk::block_fields(t), to = qk::x8_fields(t);
  const auto* w = static_cast<const uint8_t*>(W);
  auto* p = static_cast<uint8_t*>(P);
  for (int g = g0; g < g1; ++g) {
    uint8_t* dst = p + static_cast<size_t>(g) * nb * kX8Rows * bb;
    for (size_t b = 0; b < nb; ++b, dst += kX8Rows * bb)
      for (const auto& [src, out] : {std::pair{from.d, to.d}, {from.m, to.m}, {from.qh, to.qh}, {from.qs, to.qs}})
        for (int j = 0; j < kX8Rows; ++j) {
          const int o = g * kX8Rows + j;
          uint8_t* field = dst + out.at + j * out.bytes;
          if (o < n_out)
            std::memcpy(field, w + static_cast<size_t>(o) * row_bytes + b * bb + src.at, src.bytes);
          else  // past the last row: zeros
            std::memset(field, 0, out.bytes);
        }
  }
}

void matmul_x8(DType t, const void* W, const void* P, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
               size_t y_stride, uint64_t x_id) {
  const auto matvec = kernels().matvec_x8;
  const int g0 = (o0 + kX8Rows - 1) / kX8Rows, g1 = o1 / kX8Rows;
  if (matvec == nullptr || n_x > qk::kX8MaxActs || g0 >= g1 || !matvec(t, P, n_in, g0, g1, Xq, n_x, Y, y_stride))
    return matmul_q(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  // A range that starts or ends inside a group takes those rows from W.
  if (o0 < g0 * kX8Rows) matmul_q(t, W, n_in, o0, g0 * kX8Rows, Xq, n_x, Y, y_stride, x_id);
  if (g1 * kX8Rows < o1) matmul_q(t, W, n_in, g1 * kX8Rows, o1, Xq, n_x, Y, y_stride, x_id);
}

}  // namespace ctx
