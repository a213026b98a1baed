// LoRA adapters (models/lora.h) built from float32 (or float16, or bf16 bits)
// matrices Python read from an adapter GGUF; the adapter copies them, so it owns
// what a forward reads.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/lora/lora_kernels.h"
#include "models/lora.h"
#include "models/model.h"

namespace py = pybind11;

namespace ctx {

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

using U16Array = py::array_t<uint16_t, py::array::c_style | py::array::forcecast>;  // float16 or bf16 bits

bool is_f16(const py::array& a) { return a.dtype().kind() == 'f' && a.dtype().itemsize() == 2; }
bool is_u16(const py::array& a) { return a.dtype().kind() == 'u' && a.dtype().itemsize() == 2; }

// A float16 or uint16 array's bits as uint16 (a view, no conversion).
U16Array bits(const py::array& a) { return U16Array::ensure(a.attr("view")(py::dtype("uint16"))); }

// bf16 (numpy has no such type) comes as uint16 bits with bf16 = true; uint16
// without it would be converted as integers, so it is refused.
void check_bits(const py::array& a, bool bf16, const std::string& what) {
  if (bf16 != is_u16(a))
    throw std::invalid_argument(what + (bf16 ? ": bf16 matrices come as uint16 arrays of their bits"
                                             : ": a uint16 array is bf16 bits only with bf16=True"));
}

// A matrix of `type` as a C-contiguous 2-D array of its own element (float32
// for F32, float16 or uint16 bits for F16, uint16 bits for BF16, uint8 block
// bytes for Q8_0), whose bytes the adapter copies: never converted, so an
// array of another element is refused rather than read as something else.
py::array checked_matrix(const py::array& m, DType type, const std::string& what) {
  const char kind = m.dtype().kind();
  const auto size = m.dtype().itemsize();
  const bool fits = type == DType::F32    ? kind == 'f' && size == 4
                    : type == DType::F16  ? (kind == 'f' || kind == 'u') && size == 2
                    : type == DType::BF16 ? kind == 'u' && size == 2
                                          : kind == 'u' && size == 1;
  if (!fits)
    throw std::invalid_argument(what + ": a " + dtype_name(static_cast<int>(type)) + " matrix cannot come as " +
                                std::string(py::str(m.dtype())));
  if (m.ndim() != 2) throw std::invalid_argument(what + " must be a matrix");
  return py::array::ensure(m, py::array::c_style);
}

}  // namespace

void register_lora(py::module_& m) {
  py::class_<LoraAdapter>(m, "LoraAdapter", "a LoRA adapter's A and B matrices, for one loaded model")
      .def(py::init([](const Model& model, float alpha) {
             return new LoraAdapter(model.config(), &model, alpha);
           }),
           py::arg("model"), py::arg("alpha"))
      .def(
          "set",
          [](LoraAdapter& ad, int layer, const std::string& target, const py::array& a, int a_type, const py::array& b,
             int b_type) {
            const std::string what = "blk." + std::to_string(layer) + "." + target;
            const LoraTarget t = LoraAdapter::target_from_name(target);
            if (!dtype_supported(a_type) || !dtype_supported(b_type))
              throw std::invalid_argument(what + ": unknown tensor type");
            const DType at = static_cast<DType>(a_type), bt = static_cast<DType>(b_type);
            const py::array am = checked_matrix(a, at, what + " lora_a"), bm = checked_matrix(b, bt, what + " lora_b");
            if (am.shape(0) != bm.shape(1))
              throw std::invalid_argument(what + ": lora_a (rank, n_in) and lora_b (n_out, rank) disagree on the rank");
            ad.set(layer, t, at, static_cast<const uint8_t*>(am.data()), static_cast<size_t>(am.nbytes()), bt,
                   static_cast<const uint8_t*>(bm.data()), static_cast<size_t>(bm.nbytes()),
                   static_cast<int>(am.shape(0)));
          },
          py::arg("layer"), py::arg("target"), py::arg("a"), py::arg("a_type"), py::arg("b"), py::arg("b_type"),
          "one matrix's A (rank, n_in) and B (n_out, rank) as their GGUF types hold them (ggml type numbers: A "
          "F32, F16, BF16 or Q8_0, B F32, F16 or BF16), kept in those types")
      .def_property_readonly("n_matrices", &LoraAdapter::n_matrices)
      .def_property_readonly("n_bytes", &LoraAdapter::n_bytes, "what its matrices hold in memory");
  m.def(
      "lora_up",
      [](const py::array& bt, const F32Array& t, float factor, F32Array y, int o0, int o1, bool bf16) {
        // Test-facing: y (n_x, n_out) += factor * t (n_x, rank) . bt (rank, n_out), outputs [o0, o1).
        if (bt.ndim() != 2 || t.ndim() != 2 || y.ndim() != 2 || t.shape(1) != bt.shape(0) ||
            y.shape(0) != t.shape(0) || y.shape(1) != bt.shape(1) || o0 < 0 || o1 > bt.shape(1) || o0 > o1)
          throw std::invalid_argument("lora_up: bt (rank, n_out), t (n_x, rank), y (n_x, n_out), 0 <= o0 <= o1 <= n_out");
        const int rank = static_cast<int>(bt.shape(0)), n_out = static_cast<int>(bt.shape(1));
        const int n_x = static_cast<int>(t.shape(0));
        // The kernel's blocks of bt (B transposed: B's (o, j) at j * n_out + o).
        auto up = [&](auto kernel, const auto* bt_rows) {
          kernel(lora::blocks(bt_rows, n_out, rank, 1, static_cast<size_t>(n_out)).data(), rank, n_out, o0, o1,
                 t.data(), n_x, factor, y.mutable_data(), static_cast<size_t>(n_out));
        };
        check_bits(bt, bf16, "lora_up: bt");
        if (bf16)
          up(kernels().lora_up_bf16, bits(bt).data());
        else if (is_f16(bt))
          up(kernels().lora_up_f16, bits(bt).data());
        else
          up(kernels().lora_up, F32Array::ensure(bt).data());
        return y;
      },
      py::arg("bt"), py::arg("t"), py::arg("factor"), py::arg("y"), py::arg("o0"), py::arg("o1"), py::kw_only(),
      py::arg("bf16") = false,
      "y + factor * (t . bt) for outputs [o0, o1) with the active path's lora_up kernel (lora_up_f16 for a "
      "float16 bt, lora_up_bf16 for bf16 bits in a uint16 bt with bf16=True; a copy of y if it was not float32)");
}

}  // namespace ctx
