// Weights of the blocks-of-32 types repacked 8 rows to a group for one-row
// products (quant.h, "x8"): the repacking, and the matmul that sends one
// activation row's whole groups to the path's kernel for the layout and the
// rest to matmul_q on the rows.
#include <cstring>

#include "kernels/kernels.h"
#include "kernels/quant/quant.h"

namespace ctx {

namespace {

constexpr int kGroup = 8;  // rows a group

// A block's fields: offset and size within the block (size 0: none).
struct Field {
  size_t at, bytes;
};
struct Fields {
  Field d, m, qh, qs;
};

Fields fields(DType t) {
  switch (t) {
    case DType::Q4_0: return {{0, 2}, {0, 0}, {0, 0}, {2, 16}};
    case DType::Q4_1: return {{0, 2}, {2, 2}, {0, 0}, {4, 16}};
    case DType::Q5_0: return {{0, 2}, {0, 0}, {2, 4}, {6, 16}};
    case DType::Q5_1: return {{0, 2}, {2, 2}, {4, 4}, {8, 16}};
    default: return {{0, 2}, {0, 0}, {0, 0}, {2, 32}};  // Q8_0
  }
}

}  // namespace

bool dtype_has_x8(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0;
}

size_t x8_bytes(DType t, int n_in, int n_out) {
  const size_t groups = (static_cast<size_t>(n_out) + kGroup - 1) / kGroup;
  return groups * kGroup * dtype_row_bytes(t, n_in);
}

void repack_x8(DType t, const void* W, int n_in, int n_out, int g0, int g1, void* P) {
  const size_t nb = static_cast<size_t>(n_in) / QK, row_bytes = dtype_row_bytes(t, n_in), bb = row_bytes / nb;
  const Fields f = fields(t);
  const auto* w = static_cast<const uint8_t*>(W);
  auto* p = static_cast<uint8_t*>(P);
  for (int g = g0; g < g1; ++g) {
    uint8_t* dst = p + static_cast<size_t>(g) * nb * kGroup * bb;
    for (size_t b = 0; b < nb; ++b, dst += kGroup * bb) {
      // The group's block: each field of the 8 rows in turn (d, m, qh, qs).
      size_t at = 0;
      for (const Field& field : {f.d, f.m, f.qh, f.qs}) {
        for (int j = 0; j < kGroup; ++j) {
          const int o = g * kGroup + j;
          uint8_t* out = dst + at + j * field.bytes;
          if (o < n_out)
            std::memcpy(out, w + static_cast<size_t>(o) * row_bytes + b * bb + field.at, field.bytes);
          else  // past the last row: zeros
            std::memset(out, 0, field.bytes);
        }
        at += kGroup * field.bytes;
      }
    }
  }
}

void matmul_x8(DType t, const void* W, const void* P, int n_in, int o0, int o1, const BlockQ8A* Xq, int n_x, float* Y,
               size_t y_stride, uint64_t x_id) {
  const auto matvec = kernels().matvec_x8;
  const int g0 = (o0 + kGroup - 1) / kGroup, g1 = o1 / kGroup;
  if (matvec == nullptr || g0 >= g1 || !matvec(t, P, n_in, g0, g1, Xq, n_x, Y, y_stride))
    return matmul_q(t, W, n_in, o0, o1, Xq, n_x, Y, y_stride, x_id);
  // A range that starts or ends inside a group takes those rows from W.
  if (o0 < g0 * kGroup) matmul_q(t, W, n_in, o0, g0 * kGroup, Xq, n_x, Y, y_stride, x_id);
  if (g1 * kGroup < o1) matmul_q(t, W, n_in, g1 * kGroup, o1, Xq, n_x, Y, y_stride, x_id);
}

}  // namespace ctx
