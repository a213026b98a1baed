#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu.h"
#include "kernels/kernels.h"

namespace py = pybind11;

namespace ctx {

static Isa isa_from_name(const std::string& name) {
  if (name == "scalar") return Isa::scalar;
  if (name == "avx2") return Isa::avx2;
  if (name == "avx512") return Isa::avx512;
  throw std::invalid_argument("unknown ISA '" + name + "' (scalar, avx2, avx512)");
}

void register_cpu(py::module_& m) {
  m.def("detect_isa", [] { return std::string(isa_name(detect_isa())); },
        "best SIMD path this CPU supports");
  m.def("active_isa", [] { return std::string(isa_name(active_isa())); }, "SIMD path in use");
  m.def("set_isa", [](const std::string& name) { set_isa(isa_from_name(name)); }, py::arg("name"),
        "force a SIMD path (all paths give bit-identical results; tests use this)");
  m.def(
      "isa_features",
      [](const std::string& name) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const IsaFeature& f : isa_features(isa_from_name(name))) out.emplace_back(f.compiler, f.cpuinfo);
        return out;
      },
      py::arg("name"),
      "[(compiler name, /proc/cpuinfo flag)] of every feature the path is compiled with; "
      "the path is chosen only on a CPU that has them all");
}

}  // namespace ctx
