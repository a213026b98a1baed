// GGUF helpers for the Python reader (ctxengine/engine/gguf_cursor.py): what
// would be its slowest loop in Python.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace py = pybind11;

namespace ctx {

// Walks `count` GGUF strings (a little-endian u64 length, then that many
// bytes) from `pos` in the first `size` bytes of buf: (the offset just past
// the last whole one, how many were whole). Fewer than `count` means string i
// does not fit; the caller words that error.
static std::pair<uint64_t, uint64_t> skip_strings(const uint8_t* buf, uint64_t size, uint64_t pos, uint64_t count) {
  uint64_t i = 0;
  for (; i < count; ++i) {
    if (size - pos < 8) break;
    uint64_t n;
    std::memcpy(&n, buf + pos, 8);  // GGUF is little-endian, as every CPU we build for
    if (n > size - pos - 8) break;
    pos += 8 + n;
  }
  return {pos, i};
}

void register_gguf(py::module_& m) {
  m.def(
      "gguf_skip_strings",
      [](py::buffer b, uint64_t size, uint64_t pos, uint64_t count) {
        const py::buffer_info info = b.request();
        const uint64_t have = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
        if (size > have || pos > size) throw py::value_error("gguf_skip_strings: size or pos past the buffer");
        return skip_strings(static_cast<const uint8_t*>(info.ptr), size, pos, count);
      },
      py::arg("buf"), py::arg("size"), py::arg("pos"), py::arg("count"),
      "(offset past the last whole string, how many were whole) of count GGUF strings from pos "
      "in buf's first size bytes, decoding none: a header-only read's walk over a vocabulary");
}

}  // namespace ctx
