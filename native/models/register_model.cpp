// Builds a Model from GGUF tensor descriptors handed over by Python (which
// keeps the memory map alive for as long as the Model lives) and runs
// forward steps with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include "models/model.h"

namespace py = pybind11;

namespace ctx {

namespace {

// name -> (ggml type, address, ne0, ne1)
using TensorDesc = std::tuple<int, uintptr_t, int64_t, int64_t>;
using TensorMap = std::unordered_map<std::string, TensorDesc>;

const TensorDesc* find(const TensorMap& t, const std::string& name) {
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

Weight matrix(const TensorMap& t, const std::string& name, int n_in, int n_out) {
  const TensorDesc* d = find(t, name);
  if (!d) throw std::invalid_argument("missing tensor " + name);
  auto [type, addr, ne0, ne1] = *d;
  if (!dtype_supported(type)) throw std::invalid_argument("tensor " + name + " has unsupported type " + dtype_name(type));
  if (ne0 != n_in || ne1 != n_out)
    throw std::invalid_argument("tensor " + name + " has shape [" + std::to_string(ne0) + ", " + std::to_string(ne1) +
                                "], expected [" + std::to_string(n_in) + ", " + std::to_string(n_out) + "]");
  if (n_in % dtype_block_elems(static_cast<DType>(type)) != 0)
    throw std::invalid_argument("tensor " + name + " rows are not a whole number of blocks");
  Weight w;
  w.type = static_cast<DType>(type);
  w.data = reinterpret_cast<const uint8_t*>(addr);
  w.n_in = n_in;
  w.n_out = n_out;
  return w;
}

// Rows [r0, r0 + n) of a matrix: one part of a fused tensor (phi3's attn_qkv
// and its gate-and-up ffn_up), which a matmul reads like any other weight.
Weight row_slice(const Weight& w, int r0, int n) {
  Weight part = w;
  part.data = w.data + dtype_row_bytes(w.type, w.n_in) * static_cast<size_t>(r0);
  part.n_out = n;
  return part;
}

const float* vec(const TensorMap& t, const std::string& name, int n, bool required = true) {
  const TensorDesc* d = find(t, name);
  if (!d) {
    if (required) throw std::invalid_argument("missing tensor " + name);
    return nullptr;
  }
  auto [type, addr, ne0, ne1] = *d;
  if (type != static_cast<int>(DType::F32)) throw std::invalid_argument("tensor " + name + " must be F32");
  if (ne0 != n || ne1 != 1) throw std::invalid_argument("tensor " + name + " has the wrong length");
  return reinterpret_cast<const float*>(addr);
}

template <typename T>
T get(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw std::invalid_argument(std::string("model config lacks ") + key);
  return d[key].cast<T>();
}

template <typename T>
T get_or(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<T>() : fallback;
}

std::unique_ptr<Model> build(const py::dict& c, const TensorMap& t, int n_threads) {
  ModelConfig cfg;
  cfg.arch = get<std::string>(c, "arch");
  cfg.n_layer = get<int>(c, "n_layer");
  cfg.n_embd = get<int>(c, "n_embd");
  cfg.n_head = get<int>(c, "n_head");
  cfg.n_head_kv = get<int>(c, "n_head_kv");
  cfg.head_dim = get<int>(c, "head_dim");
  cfg.n_ff = get<int>(c, "n_ff");
  cfg.n_vocab = get<int>(c, "n_vocab");
  cfg.n_ctx = get<int64_t>(c, "n_ctx");
  cfg.norm_eps = get<float>(c, "norm_eps");
  cfg.rope_base = get<float>(c, "rope_base");
  cfg.rope_dim = get<int>(c, "rope_dim");
  cfg.rope_neox = get<bool>(c, "rope_neox");
  cfg.rope_scale = get_or<float>(c, "rope_scale", 1.0f);
  cfg.attn_scale = get_or<float>(c, "attn_scale", 0.0f);
  cfg.embd_scale = get_or<float>(c, "embd_scale", 1.0f);
  cfg.gelu_ffn = get_or<bool>(c, "gelu_ffn", false);
  cfg.logit_softcap = get_or<float>(c, "logit_softcap", 0.0f);
  cfg.swa_window = get_or<int>(c, "swa_window", 0);
  cfg.swa_layer = get_or<std::vector<uint8_t>>(c, "swa_layers", {});
  cfg.rope_base_swa = get_or<float>(c, "rope_base_swa", 10000.0f);
  cfg.repack_budget = get_or<size_t>(c, "repack_budget", cfg.repack_budget);

  const int E = cfg.n_embd, QD = cfg.q_dim(), KD = cfg.kv_dim(), hd = cfg.head_dim;
  ModelWeights w;
  w.tok_embd = matrix(t, "token_embd.weight", E, cfg.n_vocab);
  w.output_norm = vec(t, "output_norm.weight", E);
  w.output = find(t, "output.weight") ? matrix(t, "output.weight", E, cfg.n_vocab) : w.tok_embd;
  w.rope_freqs = vec(t, "rope_freqs.weight", cfg.rope_dim / 2, false);
  for (int i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights L;
    L.attn_norm = vec(t, p + "attn_norm.weight", E);
    if (find(t, p + "attn_qkv.weight") && !find(t, p + "attn_q.weight")) {
      const Weight qkv = matrix(t, p + "attn_qkv.weight", E, QD + 2 * KD);
      L.wq = row_slice(qkv, 0, QD);
      L.wk = row_slice(qkv, QD, KD);
      L.wv = row_slice(qkv, QD + KD, KD);
      if (const float* b = vec(t, p + "attn_qkv.bias", QD + 2 * KD, false)) {  // llama.cpp adds it before the split
        L.bq = b;
        L.bk = b + QD;
        L.bv = b + QD + KD;
      }
    } else {
      L.wq = matrix(t, p + "attn_q.weight", E, QD);
      L.wk = matrix(t, p + "attn_k.weight", E, KD);
      L.wv = matrix(t, p + "attn_v.weight", E, KD);
      L.bq = vec(t, p + "attn_q.bias", QD, false);  // each optional on its own, as in llama.cpp
      L.bk = vec(t, p + "attn_k.bias", KD, false);
      L.bv = vec(t, p + "attn_v.bias", KD, false);
    }
    L.wo = matrix(t, p + "attn_output.weight", QD, E);
    L.bo = vec(t, p + "attn_output.bias", E, false);
    L.q_norm = vec(t, p + "attn_q_norm.weight", hd, false);
    L.k_norm = vec(t, p + "attn_k_norm.weight", hd, L.q_norm != nullptr);
    L.attn_post_norm = vec(t, p + "post_attention_norm.weight", E, false);
    L.ffn_norm = vec(t, p + "ffn_norm.weight", E);
    L.ffn_post_norm = vec(t, p + "post_ffw_norm.weight", E, false);
    if (!find(t, p + "ffn_gate.weight")) {  // gate and up in one tensor, gate first (ggml_swiglu)
      const Weight both = matrix(t, p + "ffn_up.weight", E, 2 * cfg.n_ff);
      L.gate = row_slice(both, 0, cfg.n_ff);
      L.up = row_slice(both, cfg.n_ff, cfg.n_ff);
    } else {
      L.gate = matrix(t, p + "ffn_gate.weight", E, cfg.n_ff);
      L.up = matrix(t, p + "ffn_up.weight", E, cfg.n_ff);
    }
    L.down = matrix(t, p + "ffn_down.weight", cfg.n_ff, E);
    w.layers.push_back(L);
  }
  return std::make_unique<Model>(std::move(cfg), std::move(w), n_threads);
}

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

}  // namespace

void register_model(py::module_& m) {
  py::class_<Model>(m, "Model", "a decoder-only transformer over mapped GGUF weights")
      .def(py::init(&build), py::arg("config"), py::arg("tensors"), py::arg("n_threads"))
      .def_property_readonly("n_threads", &Model::n_threads)
      .def_property_readonly("n_vocab", [](const Model& m) { return m.config().n_vocab; })
      .def_property_readonly("n_embd", [](const Model& m) { return m.config().n_embd; })
      .def_property_readonly("n_layer", [](const Model& m) { return m.config().n_layer; })
      .def_property_readonly("repacked_bytes", &Model::repacked_bytes,
                             "bytes of the weights' copies for one-row products (quant.h repack_x8)")
      .def_property_readonly("kv_dim", [](const Model& m) { return m.config().kv_dim(); })
      .def(
          "forward",
          [](Model& model, py::list batch) {
            // batch: [(seq, tokens int32[n], logits float32[rows, vocab] | None, all_logits, hidden | None
            //          [, [(LoraAdapter, scale), ...]])]
            std::vector<BatchItem> items;
            std::vector<I32Array> keep_tokens;
            std::vector<py::array> keep_out;
            const int V = model.config().n_vocab, E = model.config().n_embd;
            for (py::handle h : batch) {
              auto tup = h.cast<py::tuple>();
              if (tup.size() != 5 && tup.size() != 6)
                throw std::invalid_argument("batch items are (seq, tokens, logits, all, hidden[, loras])");
              BatchItem it;
              it.seq = tup[0].cast<KVSeq*>();
              keep_tokens.emplace_back(I32Array::ensure(tup[1]));
              if (!keep_tokens.back()) throw std::invalid_argument("tokens must be an int array");
              it.tokens = keep_tokens.back().data();
              it.n_tokens = static_cast<int>(keep_tokens.back().size());
              it.all_logits = tup[3].cast<bool>();
              if (!tup[2].is_none()) {
                auto a = tup[2].cast<py::array_t<float, py::array::c_style>>();
                const py::ssize_t rows = it.all_logits ? it.n_tokens : 1;
                if (a.size() != rows * V || !a.writeable()) throw std::invalid_argument("logits buffer has the wrong size");
                it.logits = a.mutable_data();
                keep_out.push_back(a);
              }
              if (!tup[4].is_none()) {
                auto a = tup[4].cast<py::array_t<float, py::array::c_style>>();
                if (a.size() != static_cast<py::ssize_t>(it.n_tokens) * E || !a.writeable())
                  throw std::invalid_argument("hidden buffer has the wrong size");
                it.hidden = a.mutable_data();
                keep_out.push_back(a);
              }
              if (tup.size() == 6 && !tup[5].is_none())
                for (py::handle use : tup[5].cast<py::list>()) {
                  auto pair = use.cast<py::tuple>();
                  it.loras.push_back({pair[0].cast<const LoraAdapter*>(), pair[1].cast<float>()});
                }
              items.push_back(it);
            }
            // Safe without the GIL: every buffer is held by keep_* above and the
            // sequences and adapters by the caller's batch list; no Python object is touched.
            py::gil_scoped_release release;
            model.forward(items);
          },
          py::arg("batch"),
          "run one step: [(seq, tokens, logits | None, all_logits, hidden | None)]; appends KV to each seq")
      .def(
          "page_bytes",
          [](const Model& m, int page_tokens, const std::string& kv_dtype) {
            return m.page_layout(page_tokens, kv_dtype_from_name(kv_dtype)).page_bytes();
          },
          py::arg("page_tokens"), py::arg("kv_dtype") = "f16",
          "bytes of one page; raises ValueError for a KV dtype this model's shape cannot take");
}

}  // namespace ctx
