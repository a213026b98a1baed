#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu.h"
#include "core/threads.h"
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
  m.def(
      "parallel_chunks",
      [](int64_t n, int64_t grain, int threads, bool guided) {
        ThreadPool pool(threads);
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> out;
        auto note = [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lock(mu);
          out.emplace_back(b, e);
        };
        py::gil_scoped_release release;
        if (guided) pool.parallel_for_guided(n, grain, note);
        else pool.parallel_for(n, grain, note);
        return out;
      },
      py::arg("n"), py::arg("grain"), py::arg("threads"), py::arg("guided"),
      "the chunks (begin, end) a thread pool hands out over [0, n), in the order they were claimed (tests)");
}

}  // namespace ctx
