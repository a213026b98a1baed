// _core: the native decode core. This file only registers submodules; each
// concept binds itself in its own register_*.cpp.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace ctx {
void register_cpu(py::module_& m);
void register_quant(py::module_& m);
void register_kv(py::module_& m);
void register_model(py::module_& m);
void register_lora(py::module_& m);
void register_kernels(py::module_& m);
void register_mapping_guard(py::module_& m);
void register_gguf(py::module_& m);
}  // namespace ctx

PYBIND11_MODULE(_core, m) {
  m.doc() = "ctx-engine native decode core";
  ctx::register_cpu(m);
  ctx::register_mapping_guard(m);
  ctx::register_gguf(m);
  auto quant = m.def_submodule("quant", "weight formats and dot-product kernels (for tests and tools)");
  ctx::register_quant(quant);
  ctx::register_kv(m);
  ctx::register_model(m);
  ctx::register_lora(m);
  ctx::register_kernels(m);  // test-facing kernel bindings
}
