// Live figures from /metrics (the same counters Prometheus scrapes), polled
// once a second and drawn as small SVG plots of the last two minutes.

const POINTS = 120;
const NS = "http://www.w3.org/2000/svg";

// The sum over label sets of each sample name in a Prometheus text exposition.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(\S+)/);
    if (m) out[m[1]] = (out[m[1]] || 0) + Number(m[2]);
  }
  return out;
}

const FIGURES = [
  { id: "tps", title: "tokens/s", unit: "tok/s", digits: 1,
    value: (d, dt) => d.ctx_sampled_tokens_total / dt },
  { id: "queue", title: "in flight", unit: "", digits: 0,
    value: (_d, _dt, now) => now.ctx_active_streams || 0,
    second: (_d, _dt, now) => now.ctx_forward_queue || 0, legend: ["streams", "queued"] },
  { id: "hits", title: "prefix cache hits", unit: "/s", digits: 2,
    value: (d, dt) => d.ctx_prefix_cache_hits_total / dt,
    note: (now) => {
      const p = now.ctx_prompt_tokens_total || 0;
      return p ? `${Math.round(100 * (now.ctx_cached_prompt_tokens_total || 0) / p)}% of prompt tokens reused` : "";
    } },
];

export class Plots {
  constructor(container, fetchText) {
    this.container = container;
    this.fetchText = fetchText;
    this.last = null;
    this.series = Object.fromEntries(FIGURES.map((f) => [f.id, { a: [], b: [] }]));
    this.cards = {};
    for (const f of FIGURES) this.cards[f.id] = this.card(f);
  }

  card(f) {
    const card = document.createElement("div");
    card.className = "plot";
    card.dataset.figure = f.id;
    card.innerHTML = `<div class="plot-head"><span class="plot-title"></span><span class="plot-value"></span></div>
      <svg class="spark" viewBox="0 0 ${POINTS - 1} 40" preserveAspectRatio="none"></svg>
      <div class="plot-note"></div>`;
    card.querySelector(".plot-title").textContent = f.title;
    this.container.append(card);
    return card;
  }

  async tick() {
    const now = parseMetrics(await this.fetchText("/metrics"));
    const t = performance.now() / 1000;
    if (this.last) {
      const dt = Math.max(1e-3, t - this.last.t);
      const delta = {};
      for (const k of Object.keys(now)) delta[k] = Math.max(0, now[k] - (this.last.values[k] || 0));
      for (const f of FIGURES) {
        const s = this.series[f.id];
        s.a.push(f.value(delta, dt, now) || 0);
        if (f.second) s.b.push(f.second(delta, dt, now));
        if (s.a.length > POINTS) s.a.shift();
        if (s.b.length > POINTS) s.b.shift();
        this.draw(f, now);
      }
    }
    this.last = { t, values: now };
  }

  draw(f, now) {
    const card = this.cards[f.id];
    const s = this.series[f.id];
    const top = Math.max(1, ...s.a, ...s.b);
    const svg = card.querySelector(".spark");
    svg.replaceChildren();
    const line = (values, cls) => {
      if (!values.length) return;
      const x0 = POINTS - values.length;
      const pts = values.map((v, i) => `${x0 + i},${(38 - 36 * v / top).toFixed(2)}`);
      const area = document.createElementNS(NS, "polygon");
      area.setAttribute("points", `${x0},40 ${pts.join(" ")} ${POINTS - 1},40`);
      area.setAttribute("class", `area ${cls}`);
      const poly = document.createElementNS(NS, "polyline");
      poly.setAttribute("points", pts.join(" "));
      poly.setAttribute("class", `line ${cls}`);
      poly.setAttribute("vector-effect", "non-scaling-stroke");
      svg.append(area, poly);
    };
    line(s.a, "a");
    line(s.b, "b");
    const v = s.a.at(-1) ?? 0;
    const value = f.legend ? `${v} ${f.legend[0]} · ${s.b.at(-1) ?? 0} ${f.legend[1]}`
      : `${v.toFixed(f.digits)} ${f.unit}`;
    card.querySelector(".plot-value").textContent = value;
    card.querySelector(".plot-note").textContent = f.note ? f.note(now) : "";
  }
}
