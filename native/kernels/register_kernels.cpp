// The forward pass's elementwise and attention kernels, bound one by one for
// the tests that hold every SIMD path to the scalar one and to numpy. The
// engine never calls these; it runs them inside Model::forward.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <vector>

#include "kernels/activations/activations.h"
#include "kernels/attention/attention.h"

namespace py = pybind11;

namespace ctx {

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I8Array = py::array_t<int8_t, py::array::c_style | py::array::forcecast>;
using U16Array = py::array_t<uint16_t, py::array::c_style | py::array::forcecast>;

// The elementwise math, for tests that hold every SIMD path to the scalar one.
void register_elementwise(py::module_& m) {
  m.def(
      "exp_shift_sum",
      [](F32Array x, float shift) {
        py::array_t<float> y(x.size());
        std::copy(x.data(), x.data() + x.size(), y.mutable_data());
        const double sum = exp_shift_sum(y.mutable_data(), static_cast<int>(y.size()), shift);
        return py::make_tuple(y, sum);
      },
      py::arg("x"), py::arg("shift"), "(exp(x - shift), sum) with the engine's canonical exp");
  m.def(
      "rmsnorm_rows",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> x, F32Array w, float eps) {
        if (x.ndim() != 2 || x.shape(1) != w.size()) throw std::invalid_argument("need x (rows, n) and w (n)");
        py::array_t<float> y({x.shape(0), x.shape(1)});
        rmsnorm_rows(x.data(), w.data(), y.mutable_data(), static_cast<int>(x.shape(0)), static_cast<int>(x.shape(1)), eps);
        return y;
      },
      py::arg("x"), py::arg("w"), py::arg("eps"), "RMS norm of each row of x, times w, as llama.cpp computes it");
  m.def(
      "silu_mul",
      [](F32Array g, F32Array u) {
        if (g.size() != u.size()) throw std::invalid_argument("g and u differ in length");
        py::array_t<float> y(g.size());
        std::copy(g.data(), g.data() + g.size(), y.mutable_data());
        silu_mul(y.mutable_data(), u.data(), static_cast<int>(y.size()));
        return y;
      },
      py::arg("g"), py::arg("u"), "silu(g) * u");
  m.def(
      "gelu_mul",
      [](F32Array g, F32Array u) {
        if (g.size() != u.size()) throw std::invalid_argument("g and u differ in length");
        py::array_t<float> y(g.size());
        std::copy(g.data(), g.data() + g.size(), y.mutable_data());
        gelu_mul(y.mutable_data(), u.data(), static_cast<int>(y.size()));
        return y;
      },
      py::arg("g"), py::arg("u"), "gelu(g) * u (the tanh GELU by llama.cpp's f16 table)");
  m.def(
      "rope",
      [](F32Array v, F32Array cs, bool neox) {
        // v (n_heads, hd) rotated in a copy by the angles cs (cos[half], then sin[half])
        if (v.ndim() != 2 || cs.ndim() != 1 || cs.size() % 2 != 0 || cs.size() > v.shape(1))
          throw std::invalid_argument("need v (n_heads, hd) and cs (2 * half) with 2 * half <= hd");
        py::array_t<float> out({v.shape(0), v.shape(1)});
        std::copy(v.data(), v.data() + v.size(), out.mutable_data());
        rope_heads(out.mutable_data(), static_cast<int>(v.shape(0)), static_cast<int>(v.shape(1)),
                   static_cast<int>(cs.size() / 2), neox, cs.data());
        return out;
      },
      py::arg("v"), py::arg("cs"), py::arg("neox"), "RoPE of each head (row of v) by one position's angles");
}

// The attention kernels over f16 pages.
void register_attention_f16(py::module_& m) {
  m.def(
      "attn_scores",
      [](F32Array q, py::array_t<uint16_t, py::array::c_style | py::array::forcecast> kt, int n, float scale) {
        // kt: (hd, stride) f16 bits, as a head's K block sits in a page
        if (kt.ndim() != 2 || kt.shape(0) != q.size() || n > kt.shape(1))
          throw std::invalid_argument("kt must be (len(q), stride) with n <= stride");
        py::array_t<float> out(n);
        attn_scores_f16(q.data(), 1, kt.data(), static_cast<int>(q.size()), static_cast<int>(kt.shape(1)), n, scale,
                        out.mutable_data(), n);
        return out;
      },
      py::arg("q"), py::arg("kt"), py::arg("n"), py::arg("scale"), "scores of n keys of a page's K block");
  m.def(
      "attn_softmax_v",
      [](F32Array scores, py::array_t<uint16_t, py::array::c_style | py::array::forcecast> v, F32Array out) {
        // scores (n) -> max, exp, f16-rounded weights; v (n, hd) f16 rows; out (hd) accumulated in place
        if (v.ndim() != 2 || v.shape(0) != scores.size() || v.shape(1) != out.size())
          throw std::invalid_argument("v must be (len(scores), len(out))");
        // (out is overwritten; it gives the head size)
        std::vector<float> p(scores.data(), scores.data() + scores.size());
        const int n = static_cast<int>(p.size()), hd = static_cast<int>(v.shape(1));
        const float mx = max_f32(p.data(), n);
        scale_round_f16(p.data(), n, static_cast<float>(1.0 / exp_shift_sum(p.data(), n, mx)));
        std::vector<const uint16_t*> pages;  // 16 rows a page, as attention reads them
        for (int k = 0; k < n; k += 16) pages.push_back(v.data() + static_cast<size_t>(k) * hd);
        py::array_t<float> res(out.size());
        const uint16_t* const* lists[1] = {pages.data()};
        float* outs[1] = {res.mutable_data()};
        attn_accumulate_f16(p.data(), n, 1, lists, 0, 16, hd, &n, hd, outs, false);
        return py::make_tuple(res, mx);
      },
      py::arg("scores"), py::arg("v"), py::arg("out"), "softmax weights of scores applied to V rows");

}

// The attention kernels over q8 pages, and a group of heads through either.
void register_attention_q8(py::module_& m) {
  m.def(
      "attn_scores_q8",
      [](F32Array q, I8Array kq, U16Array ks, int n, float scale) {
        // kq: (hd, stride) int8 and ks: (hd / 32, stride) f16 bits, as a head's K sits in a q8 page
        const py::ssize_t hd = q.size();
        if (hd % 32 != 0 || kq.ndim() != 2 || kq.shape(0) != hd || ks.ndim() != 2 || ks.shape(0) != hd / 32 ||
            ks.shape(1) != kq.shape(1) || n > kq.shape(1))
          throw std::invalid_argument("need len(q) % 32 == 0, kq (len(q), stride), ks (len(q) / 32, stride), n <= stride");
        py::array_t<float> out(n);
        attn_scores_q8(q.data(), 1, kq.data(), ks.data(), static_cast<int>(hd), static_cast<int>(kq.shape(1)), n, scale,
                       out.mutable_data(), n);
        return out;
      },
      py::arg("q"), py::arg("kq"), py::arg("ks"), py::arg("n"), py::arg("scale"),
      "scores of n keys of a q8 page's K block");
  m.def(
      "attn_softmax_v_q8",
      [](F32Array scores, I8Array vq, U16Array vs, F32Array out) {
        // like attn_softmax_v, with V as int8 rows (n, hd) and f16 scales (n, hd / 32)
        const py::ssize_t n = scores.size(), hd = out.size();
        if (hd % 32 != 0 || vq.ndim() != 2 || vq.shape(0) != n || vq.shape(1) != hd || vs.ndim() != 2 ||
            vs.shape(0) != n || vs.shape(1) != hd / 32)
          throw std::invalid_argument("need len(out) % 32 == 0, vq (len(scores), len(out)), vs (len(scores), len(out) / 32)");
        std::vector<float> p(scores.data(), scores.data() + n);
        const float mx = max_f32(p.data(), static_cast<int>(n));
        scale_round_f16(p.data(), static_cast<int>(n),
                        static_cast<float>(1.0 / exp_shift_sum(p.data(), static_cast<int>(n), mx)));
        std::vector<const int8_t*> pages;
        std::vector<const uint16_t*> scales;
        for (py::ssize_t k = 0; k < n; k += 16) {
          pages.push_back(vq.data() + k * hd);
          scales.push_back(vs.data() + k * (hd / 32));
        }
        py::array_t<float> res(hd);
        const int8_t* const* lists[1] = {pages.data()};
        const uint16_t* const* scale_lists[1] = {scales.data()};
        float* outs[1] = {res.mutable_data()};
        const int count = static_cast<int>(n);
        attn_accumulate_q8(p.data(), count, 1, lists, scale_lists, 0, 16, static_cast<int>(hd),
                           static_cast<int>(hd / 32), &count, static_cast<int>(hd), outs, false);
        return py::make_tuple(res, mx);
      },
      py::arg("scores"), py::arg("vq"), py::arg("vs"), py::arg("out"), "softmax weights of scores applied to q8 V rows");
  m.def(
      "attn_group",
      [](F32Array q, U16Array kt, I8Array kq, U16Array ks, F32Array p, U16Array v, I8Array vq, U16Array vs, int n,
         float scale, std::optional<py::array_t<int, py::array::c_style | py::array::forcecast>> counts, int shared,
         bool hot) {
        // The grouped kernels, f16 or q8 (kq empty: f16): q (g, hd) scores the
        // first min(n, 16) keys of one page's K (hd, 16); the weights p (g, n)
        // meet V, read in pages of 16 rows: V (n, hd) for every query, or
        // (g, n, hd), query h reading pages [0, shared) of V[0] and the rest of
        // V[h]. Query h takes keys [0, counts[h]) (counts None or empty: n). Returns
        // (scores, out (g, hd)).
        if (q.ndim() != 2 || p.ndim() != 2 || p.shape(0) != q.shape(0) || p.shape(1) != n || n < 1)
          throw std::invalid_argument("need q (g, hd), p (g, n), n >= 1");
        const int g = static_cast<int>(q.shape(0)), hd = static_cast<int>(q.shape(1)), nk = std::min(n, 16);
        if (g < 1 || g > kMaxGroup) throw std::invalid_argument("group of 1 to kMaxGroup queries");
        const bool q8 = kq.size() > 0;
        const py::ssize_t per = q8 ? vq.size() / (static_cast<py::ssize_t>(n) * hd) : v.size() / (static_cast<py::ssize_t>(n) * hd);
        if (per != 1 && per != g) throw std::invalid_argument("V must be (n, hd) or (g, n, hd)");
        if (q8 ? (kq.size() != hd * 16 || ks.size() != hd / 32 * 16 || vq.size() != per * n * hd ||
                  vs.size() != per * n * hd / 32)
               : (kt.size() != hd * 16 || v.size() != per * n * hd))
          throw std::invalid_argument("K must be (hd, 16) and V (n, hd) or (g, n, hd), with hd / 32 scale rows for q8");
        std::vector<int> ns(g, n);
        if (counts && counts->size() > 0) {
          if (counts->size() != g) throw std::invalid_argument("counts: one per query");
          for (int h = 0; h < g; ++h) {
            ns[h] = counts->data()[h];
            if (ns[h] < 1 || ns[h] > n) throw std::invalid_argument("counts must be in 1..n");
          }
        }
        const int n_pages = (n + 15) / 16;
        if (per == 1) shared = n_pages;
        py::array_t<float> scores({g, nk}), out({g, hd});
        std::vector<const int8_t*> v8(static_cast<size_t>(g) * n_pages);
        std::vector<const uint16_t*> v16(v8.size()), s16(v8.size());
        std::vector<const int8_t* const*> l8(g);
        std::vector<const uint16_t* const*> l16(g), ls(g);
        std::vector<float*> outs(g);
        for (int h = 0; h < g; ++h) {
          for (int i = 0; i < n_pages; ++i) {
            const size_t src = i < shared ? 0 : h, row = src * n + static_cast<size_t>(i) * 16;
            v16[h * n_pages + i] = v.data() + row * hd;
            v8[h * n_pages + i] = vq.data() + row * hd;
            s16[h * n_pages + i] = vs.data() + row * (hd / 32);
          }
          l16[h] = &v16[h * n_pages];
          l8[h] = &v8[h * n_pages];
          ls[h] = &s16[h * n_pages];
          outs[h] = out.mutable_data() + static_cast<size_t>(h) * hd;
        }
        if (q8) {
          attn_scores_q8(q.data(), g, kq.data(), ks.data(), hd, 16, nk, scale, scores.mutable_data(), nk);
          attn_accumulate_q8(p.data(), n, g, l8.data(), ls.data(), shared, 16, hd, hd / 32, ns.data(), hd, outs.data(),
                             hot);
        } else {
          attn_scores_f16(q.data(), g, kt.data(), hd, 16, nk, scale, scores.mutable_data(), nk);
          attn_accumulate_f16(p.data(), n, g, l16.data(), shared, 16, hd, ns.data(), hd, outs.data(), hot);
        }
        return py::make_tuple(scores, out);
      },
      py::arg("q"), py::arg("kt"), py::arg("kq"), py::arg("ks"), py::arg("p"), py::arg("v"), py::arg("vq"),
      py::arg("vs"), py::arg("n"), py::arg("scale"), py::arg("counts") = py::none(), py::arg("shared") = 0,
      py::arg("hot") = false,
      "a group of queries through the attention kernels: one page of K, every page of V (hot: as for a prompt's rows)");
}

}  // namespace

void register_kernels(py::module_& m) {
  register_elementwise(m);
  register_attention_f16(m);
  register_attention_q8(m);
}

}  // namespace ctx
