// ctxengine._core.quant: the weight formats and kernels with numpy arrays in
// and out, for tests and tools. The kernels run on whatever path
// ctxengine._core.set_isa chose.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kernels/quant/quant.h"
#include "kernels/quant/quant_impl.h"

namespace py = pybind11;

namespace ctx {

namespace {

template <class T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

DType checked_type(int ggml_type) {
  if (!dtype_supported(ggml_type)) throw py::value_error(std::string("unsupported tensor type ") + dtype_name(ggml_type));
  return static_cast<DType>(ggml_type);
}

// Output rows [0, n_out) in calls of `chunk` rows (0: one call), as
// Model::matmul splits them across threads: the kernels see o0 > 0.
template <class Fn>
void for_chunks(int o0, int o1, int chunk, Fn fn) {
  if (chunk == 0) return fn(o0, o1);
  for (int o = o0; o < o1; o += chunk) fn(o, std::min(o1, o + chunk));
}

void check_row_length(DType t, int64_t n) {
  if (n < 0 || n % dtype_block_elems(t) != 0)
    throw py::value_error(std::string(dtype_name(static_cast<int>(t))) + " rows need a multiple of " +
                          std::to_string(dtype_block_elems(t)) + " elements, got " + std::to_string(n));
}

py::array_t<float> matmul(int ggml_type, const Array<uint8_t>& W, int n_in, int n_out, const Array<float>& X, int o0,
                          int o1, int chunk, bool float_x, const std::optional<Array<uint8_t>>& x8) {
  const DType t = checked_type(ggml_type);
  if (float_x && t != DType::Q8_0 && dtype_act_format(t) != ActFormat::f32)
    throw py::value_error("float_x: only Q8_0 and the float types multiply float activations");
  if (x8 && (!dtype_has_x8(t) || float_x))
    throw py::value_error(std::string("x8: ") + dtype_name(ggml_type) + " has no repacked layout for Q8A activations");
  if (x8 && static_cast<size_t>(x8->size()) != x8_bytes(t, n_in, n_out))
    throw py::value_error("x8 has " + std::to_string(x8->size()) + " bytes, expected " +
                          std::to_string(x8_bytes(t, n_in, n_out)));
  check_row_length(t, n_in);
  if (n_out < 0) throw py::value_error("n_out must be >= 0");
  if (o1 < 0) o1 = n_out;
  if (o0 < 0 || o0 > o1 || o1 > n_out) throw py::value_error("need 0 <= o0 <= o1 <= n_out");
  if (chunk < 0) throw py::value_error("chunk must be >= 0");
  if (X.ndim() != 2 || X.shape(1) != n_in)
    throw py::value_error("X must have shape (n_x, " + std::to_string(n_in) + ")");
  const size_t w_bytes = dtype_row_bytes(t, n_in) * static_cast<size_t>(n_out);
  if (static_cast<size_t>(W.size()) != w_bytes)
    throw py::value_error("W has " + std::to_string(W.size()) + " bytes, expected " + std::to_string(w_bytes));
  const auto n_x = static_cast<int>(X.shape(0));
  py::array_t<float> Y({static_cast<py::ssize_t>(n_x), static_cast<py::ssize_t>(n_out)});
  const uint8_t* w = W.data();
  const float* x = X.data();
  float* y = Y.mutable_data();
  std::fill(y, y + static_cast<size_t>(n_x) * n_out, 0.0f);  // outside [o0, o1)
  {
    // Safe without the GIL: W and X are C-contiguous buffers (forcecast copies
    // when needed) owned or referenced by the py::array arguments this frame
    // holds until it returns, Y is a fresh array nobody else sees yet, and
    // nothing below touches a Python object.
    py::gil_scoped_release no_gil;
    if (dtype_is_quantized(t) && !float_x) {
      const int nb = n_in / QK;
      std::vector<BlockQ8A> xq(static_cast<size_t>(n_x) * nb);
      for (int r = 0; r < n_x; ++r) quantize_row_q8a(x + static_cast<size_t>(r) * n_in, &xq[static_cast<size_t>(r) * nb], n_in);
      // The chunks name their rows with one x_id, as Model::matmul's do (quant.h).
      const uint64_t x_id = new_activation_id();
      for_chunks(o0, o1, chunk, [&](int a, int b) {
        if (x8)
          matmul_x8(t, w, x8->data(), n_in, a, b, xq.data(), n_x, y, static_cast<size_t>(n_out), x_id);
        else
          matmul_q(t, w, n_in, a, b, xq.data(), n_x, y, static_cast<size_t>(n_out), x_id);
      });
    } else if (dtype_is_kquant(t)) {
      const int nb = n_in / QK_K;
      std::vector<BlockQ8K> xk(static_cast<size_t>(n_x) * nb);
      for (int r = 0; r < n_x; ++r) quantize_row_q8k(x + static_cast<size_t>(r) * n_in, &xk[static_cast<size_t>(r) * nb], n_in);
      for_chunks(o0, o1, chunk, [&](int a, int b) { matmul_k(t, w, n_in, a, b, xk.data(), n_x, y, static_cast<size_t>(n_out)); });
    } else {
      for_chunks(o0, o1, chunk, [&](int a, int b) { matmul_f(t, w, n_in, a, b, x, n_x, y, static_cast<size_t>(n_out)); });
    }
  }
  return Y;
}

py::array_t<uint8_t> repack(int ggml_type, const Array<uint8_t>& W, int n_in, int n_out) {
  const DType t = checked_type(ggml_type);
  if (!dtype_has_x8(t)) throw py::value_error(std::string(dtype_name(ggml_type)) + " has no repacked layout");
  check_row_length(t, n_in);
  if (n_out < 0) throw py::value_error("n_out must be >= 0");
  if (static_cast<size_t>(W.size()) != dtype_row_bytes(t, n_in) * static_cast<size_t>(n_out))
    throw py::value_error("W is not n_out rows of n_in weights");
  py::array_t<uint8_t> P(static_cast<py::ssize_t>(x8_bytes(t, n_in, n_out)));
  repack_x8(t, W.data(), n_in, n_out, 0, (n_out + 7) / 8, P.mutable_data());
  return P;
}

py::bytes quantize_q8a(const Array<float>& x) {
  if (x.ndim() != 1 || x.shape(0) % QK != 0) throw py::value_error("x must be 1-D with a multiple of 32 elements");
  std::vector<BlockQ8A> blocks(static_cast<size_t>(x.shape(0) / QK));
  quantize_row_q8a(x.data(), blocks.data(), static_cast<int>(x.shape(0)));
  return py::bytes(reinterpret_cast<const char*>(blocks.data()), blocks.size() * sizeof(BlockQ8A));
}

py::array_t<float> dequantize(int ggml_type, const Array<uint8_t>& data, int n) {
  const DType t = checked_type(ggml_type);
  check_row_length(t, n);
  if (static_cast<size_t>(data.size()) != dtype_row_bytes(t, n))
    throw py::value_error("data has " + std::to_string(data.size()) + " bytes, expected " +
                          std::to_string(dtype_row_bytes(t, n)));
  py::array_t<float> out(n);
  dequantize_row(t, data.data(), out.mutable_data(), n);
  return out;
}

py::bytes quantize_q8k(const Array<float>& x) {
  if (x.ndim() != 1 || x.shape(0) % QK_K != 0) throw py::value_error("x must be 1-D with a multiple of 256 elements");
  std::vector<BlockQ8K> blocks(static_cast<size_t>(x.shape(0) / QK_K));
  quantize_row_q8k(x.data(), blocks.data(), static_cast<int>(x.shape(0)));
  return py::bytes(reinterpret_cast<const char*>(blocks.data()), blocks.size() * sizeof(BlockQ8K));
}

py::tuple quantize_kv8(const Array<float>& x) {
  if (x.ndim() != 1 || x.shape(0) % QK != 0) throw py::value_error("x must be 1-D with a multiple of 32 elements");
  py::array_t<int8_t> qs(x.shape(0));
  py::array_t<uint16_t> d(x.shape(0) / QK);
  quantize_row_kv8(x.data(), qs.mutable_data(), d.mutable_data(), static_cast<int>(x.shape(0)));
  return py::make_tuple(qs, d);
}

py::array_t<uint16_t> to_f16(const Array<float>& x) {
  py::array_t<uint16_t> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  f32_to_f16_row(x.data(), out.mutable_data(), static_cast<int>(x.size()));
  return out;
}

py::array_t<float> round_act(const Array<float>& x, const std::string& to) {
  if (to != "f16" && to != "bf16") throw py::value_error("to is 'f16' or 'bf16', got '" + to + "'");
  py::array_t<float> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  (to == "f16" ? round_row_f16 : round_row_bf16)(x.data(), out.mutable_data(), static_cast<int>(x.size()));
  return out;
}

}  // namespace

void register_quant(py::module_& m) {
  m.def("supported_types", [] {
    std::vector<int> out;
    for (int t = 0; t < 64; ++t)
      if (dtype_supported(t)) out.push_back(t);
    return out;
  }, "GGML type ids the kernels handle");
  m.def("dtype_name", [](int t) { return std::string(dtype_name(t)); }, py::arg("ggml_type"));
  m.def("row_bytes", [](int t, int64_t n) {
    const DType d = checked_type(t);
    check_row_length(d, n);
    return dtype_row_bytes(d, n);
  }, py::arg("ggml_type"), py::arg("n"), "bytes of one row of n elements");
  m.def("matmul", &matmul, py::arg("ggml_type"), py::arg("W"), py::arg("n_in"), py::arg("n_out"), py::arg("X"),
        py::arg("o0") = 0, py::arg("o1") = -1, py::arg("chunk") = 0, py::kw_only(), py::arg("float_x") = false,
        py::arg("x8") = py::none(),
        "Y (n_x, n_out) = X . W^T; W: raw row-major weight bytes. Quantized types quantize X to Q8A "
        "(blocks of 32) or Q8K (K-quants) first, except Q8_0 with float_x=True (matmul_f: the weights "
        "widened, as LoRA's A). Only output columns [o0, o1) are computed (o1 = -1: "
        "n_out), as one thread of the model's split does; the rest are 0. chunk > 0: the kernel is called "
        "per `chunk` output rows of that range, as the model's threads split them. x8: W "
        "repacked by repack_x8, taken where the path reads that layout (1-2 rows), as the model does.");
  m.def("repack_x8", &repack, py::arg("ggml_type"), py::arg("W"), py::arg("n_in"), py::arg("n_out"),
        "rows of a blocks-of-32 type -> decode's layout, 8 rows a group (quant.h): matmul's x8");
  m.def("quantize_q8k", &quantize_q8k, py::arg("x"), "one activation row -> raw BlockQ8K bytes (292 per 256 elements)");
  m.def("quantize_q8a", &quantize_q8a, py::arg("x"), "one activation row -> raw BlockQ8A bytes (40 per 32 elements)");
  m.def("quantize_kv8", &quantize_kv8, py::arg("x"),
        "one K or V row -> (int8 values, f16 scale bits per 32), as q8 KV pages store it");
  m.def("dequantize", &dequantize, py::arg("ggml_type"), py::arg("data"), py::arg("n"), "one row -> float32");
  m.def("f32_to_f16", &to_f16, py::arg("x"), "round to f16 bits (round to nearest even), same shape");
  m.def("round_act", &round_act, py::arg("x"), py::arg("to"),
        "x rounded to f16 or bf16 and widened back, as F16 / BF16 matmuls take their activations (quant.h)");
  m.def("prefill_tiles", [] { return std::string(qk::prefill_tiles() == qk::PrefillTiles::zmm ? "zmm" : "ymm"); },
        "the AVX-512 prefill's tile form: 'zmm' (two pairs a register, where 512-bit units are whole) or 'ymm'");
  m.def("set_prefill_tiles", [](const std::string& name) {
    if (name != "ymm" && name != "zmm") throw py::value_error("prefill tiles are 'ymm' or 'zmm', got '" + name + "'");
    qk::set_prefill_tiles(name == "zmm" ? qk::PrefillTiles::zmm : qk::PrefillTiles::ymm);
  }, py::arg("name"), "force the AVX-512 prefill's tile form (both give the same bits; tests force each)");
  m.def("avx2_vnni", &qk::avx2_vnni, "whether the AVX2 path's prefill uses AVX-VNNI (where the CPU has it)");
  m.def("set_avx2_vnni", &qk::set_avx2_vnni, py::arg("on"),
        "force the AVX2 path's prefill with or without AVX-VNNI (the same bits; ValueError where the CPU lacks it)");
}

}  // namespace ctx
