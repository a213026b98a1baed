// The right-hand panels: sampling settings, models, the snapshot store.
import { bytes, h } from "./ui.js";

const SAMPLING_KEY = "ctx-studio-sampling";
// The engine's own defaults (docs/http-api.md), shown so that what is sent is what is seen.
const DEFAULTS = { temperature: 0.8, top_p: 0.95, top_k: 40, min_p: 0.05, seed: "", max_tokens: 256 };
const FIELDS = [
  ["temperature", "temperature", { step: "0.05", min: "0", max: "2" }],
  ["top_p", "top p", { step: "0.01", min: "0", max: "1" }],
  ["top_k", "top k", { step: "1", min: "0" }],
  ["min_p", "min p", { step: "0.01", min: "0", max: "1" }],
  ["seed", "seed", { step: "1", min: "0", placeholder: "random" }],
  ["max_tokens", "max tokens", { step: "1", min: "1" }],
];

export class Sampling {
  constructor(form, onChange) {
    this.form = form;
    this.onChange = onChange;
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(SAMPLING_KEY) || "{}"); } catch { saved = {}; }
    const grid = form.querySelector(".fields");
    for (const [name, label, attrs] of FIELDS) {
      const value = saved[name] ?? DEFAULTS[name];
      grid.append(h("label", { class: "field" }, h("span", { text: label }),
        h("input", { name, type: "number", value, ...attrs })));
    }
    form.addEventListener("input", () => {
      localStorage.setItem(SAMPLING_KEY, JSON.stringify(this.raw()));
      this.onChange();
    });
  }

  raw() {
    return Object.fromEntries(FIELDS.map(([name]) => [name, this.form.elements[name].value]));
  }

  // The request fields: numbers as numbers, an empty seed left out (random).
  params() {
    const out = {};
    for (const [name, value] of Object.entries(this.raw())) {
      if (value === "") continue;
      out[name] = ["top_k", "seed", "max_tokens"].includes(name) ? parseInt(value, 10) : parseFloat(value);
    }
    return out;
  }

  describe() {
    const p = this.params();
    return [`temperature ${p.temperature ?? "default"}`, `top_p ${p.top_p ?? "default"}`,
      `top_k ${p.top_k ?? "default"}`, `min_p ${p.min_p ?? "default"}`,
      `seed ${p.seed ?? "random"}`, `max ${p.max_tokens ?? "∞"} tokens`].join(" · ");
  }
}

export function renderModels(container, models) {
  container.replaceChildren(h("p", { class: "muted small" },
    `Memory budget ${bytes(models.memory_budget)}; least recently used models unload past it.`));
  for (const m of models.data) {
    let status;
    if (!m.servable) {
      status = h("div", { class: "model-status bad" }, `cannot serve: ${m.error || "no file"}`);
    } else if (m.loaded) {
      status = h("div", { class: "model-status" },
        h("span", { class: "pill on", text: "loaded" }),
        ` ${bytes(m.memory_bytes)} · KV ${m.kv} · ${m.kv_pages_in_use}/${m.kv_pages_max} pages · `,
        `${m.n_contexts} context${m.n_contexts === 1 ? "" : "s"}`);
    } else {
      status = h("div", { class: "model-status" }, h("span", { class: "pill", text: "not loaded" }),
        ` file ${bytes(m.file_bytes)}`);
    }
    container.append(h("div", { class: `model${m.servable ? "" : " unservable"}`, "data-model": m.name },
      h("div", { class: "model-name" }, h("strong", { text: m.name }), h("span", { class: "tag", text: m.source })),
      status));
  }
}

export function renderStore(container, s) {
  if (!s) {
    container.replaceChildren(h("p", { class: "muted small", text: "This server has no snapshot store." }));
    return;
  }
  const rows = [
    ["pages", s.n_pages.toLocaleString()], ["snapshots", s.n_manifests.toLocaleString()],
    ["refs", s.n_refs.toLocaleString()], ["stored", bytes(s.stored_bytes)],
    ["dedup", `${s.dedup_ratio.toFixed(2)}×`], ["zstd", `${s.compression_ratio.toFixed(2)}×`],
    ["file", bytes(s.file_bytes)],
  ];
  container.replaceChildren(h("dl", { class: "stats" },
    rows.map(([k, v]) => [h("dt", { text: k }), h("dd", { "data-stat": k, text: v })])));
}
