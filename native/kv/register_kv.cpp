// Python face of the page pool and page tables. The store never sees these
// objects: it gets and gives raw page bytes (export_page / import_page).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <vector>
#include <memory>
#include <stdexcept>
#include <string>

#include "kv/page_pool.h"

namespace py = pybind11;

namespace ctx {

void register_kv(py::module_& m) {
  py::class_<PagePool, std::shared_ptr<PagePool>>(m, "PagePool", "fixed-size KV pages with reference counts")
      .def(py::init([](int n_layer, int page_tokens, int kv_dim, const std::string& kv_dtype, int64_t max_pages) {
             PageLayout lay;
             lay.n_layer = n_layer;
             lay.page_tokens = page_tokens;
             lay.kv_dim = kv_dim;
             lay.dtype = kv_dtype_from_name(kv_dtype);
             return std::make_shared<PagePool>(lay, max_pages);
           }),
           py::arg("n_layer"), py::arg("page_tokens"), py::arg("kv_dim"), py::arg("kv_dtype"), py::arg("max_pages"),
           "kv_dtype: 'f16', 'q8' (K and V int8 with f16 scales per 32) or 'vq8' (K f16, V int8)")
      .def_property_readonly("page_bytes", &PagePool::page_bytes)
      .def_property_readonly("kv_dtype", [](const PagePool& p) { return std::string(kv_dtype_name(p.layout().dtype)); })
      .def_property_readonly("page_tokens", [](const PagePool& p) { return p.layout().page_tokens; })
      .def_property_readonly("max_pages", &PagePool::max_pages)
      .def_property_readonly("n_used", &PagePool::n_used)
      .def_property_readonly("n_allocated", &PagePool::n_allocated)
      .def("refcount", &PagePool::refcount, py::arg("page"))
      .def(
          "export_page",
          [](PagePool& p, PageId id) {
            if (p.refcount(id) <= 0) throw std::invalid_argument("export of a free page");
            return py::bytes(reinterpret_cast<const char*>(p.data(id)), p.page_bytes());
          },
          py::arg("page"), "raw bytes of a page (what the store hashes and keeps)")
      .def(
          "import_page",
          [](PagePool& p, py::bytes raw) {
            std::string_view view = raw;
            if (view.size() != p.page_bytes())
              throw std::invalid_argument("page of " + std::to_string(view.size()) + " bytes, expected " +
                                          std::to_string(p.page_bytes()));
            PageId id = p.alloc();
            std::memcpy(p.data(id), view.data(), view.size());
            return id;
          },
          py::arg("raw"), "a new page (refcount 1) holding these bytes; release it when attached")
      .def("release", &PagePool::decref, py::arg("page"), "drop one reference");

  py::class_<KVSeq>(m, "KVSeq", "a sequence's page table: ordered page ids and a token count")
      .def(py::init([](std::shared_ptr<PagePool> pool, std::shared_ptr<PagePool> trim_pool, int window,
                       std::vector<int> keep_layers) {
             if (!trim_pool) return std::make_unique<KVSeq>(std::move(pool));
             auto swa = std::make_shared<SwaRelease>();
             swa->window = window;
             swa->keep_layers = std::move(keep_layers);
             swa->trim_pool = std::move(trim_pool);
             return std::make_unique<KVSeq>(std::move(pool), std::move(swa));
           }),
           py::arg("pool"), py::arg("trim_pool") = nullptr, py::arg("window") = 0,
           py::arg("keep_layers") = std::vector<int>{},
           "a page table; with trim_pool, pages wholly outside a `window`-token sliding window keep only "
           "keep_layers (they move to trim_pool)")
      .def_property_readonly("n_tokens", &KVSeq::n_tokens)
      .def_property_readonly("n_released", &KVSeq::n_released, "leading pages held released (in the trim pool)")
      .def("release_target", &KVSeq::release_target, py::arg("n_tokens"),
           "how many leading pages a sequence of n tokens keeps released")
      .def("can_truncate", &KVSeq::can_truncate, py::arg("n_tokens"),
           "whether truncate(n) keeps every page the sliding window at n needs")
      .def("defer_release", &KVSeq::defer_release, py::arg("defer"),
           "while deferred, appends release no page (rows that may be truncated away); ending it releases "
           "what the length calls for")
      .def_property_readonly("release_deferred", &KVSeq::release_deferred)
      .def_property_readonly("pages", [](const KVSeq& s) { return s.pages(); })
      .def_property_readonly("pool", [](const KVSeq& s) { return s.pool_ptr(); })
      .def("fork", &KVSeq::fork, "share every page copy-on-write: O(pages), no KV bytes copied")
      .def("truncate", &KVSeq::truncate, py::arg("n_tokens"),
           "keep the first n tokens; refused (a full pool), the sequence is left as it was")
      .def("pages_to_truncate", &KVSeq::pages_to_truncate, py::arg("n_tokens"),
           "pages truncate(n) takes from the pool (its copy-on-write page): room to make first")
      .def("append_page", &KVSeq::append_page, py::arg("page"), py::arg("n_valid"), py::arg("released") = false,
           "attach a page (takes its own reference); released: a trim-pool page, before every full one")
      .def(
          "export_page",
          [](const KVSeq& s, int64_t index) {
            if (index < 0) throw std::out_of_range("page index out of range");
            size_t n = 0;
            const uint8_t* data = s.page_data(static_cast<size_t>(index), &n);
            return py::bytes(reinterpret_cast<const char*>(data), n);
          },
          py::arg("index"));
}

}  // namespace ctx
