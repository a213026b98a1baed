// The studio's entry point: the login gate, the tree on the left, the chat in the
// middle, sampling / live figures / models / store on the right.
import * as api from "./api.js";
import { Chat } from "./chat.js";
import { Plots } from "./plots.js";
import { Sampling, renderModels, renderStore } from "./panels.js";
import { renderTree } from "./tree.js";
import { ask, bytes, freeName, toast } from "./ui.js";

const $ = (id) => document.getElementById(id);

class Studio {
  constructor() {
    this.info = null;
    this.forest = [];
    this.timers = [];
    this.sampling = new Sampling($("sampling"), () => this.showSettings());
    this.chat = new Chat(this);
    this.plots = new Plots($("plots"), api.text);
    $("login-form").addEventListener("submit", (e) => { e.preventDefault(); this.login(); });
    $("lock").addEventListener("click", () => { api.key.clear(); this.locked(""); });
    $("new-context").addEventListener("click", () => this.chat.clear());
    $("model").addEventListener("change", () => { this.chat.render(); this.showSettings(); });
    $("gc").addEventListener("click", () => this.gc());
    $("generate").addEventListener("click", () => this.chat.stream(null));
    for (const b of document.querySelectorAll("#chat-actions button")) {
      b.addEventListener("click", () => this.action(b.dataset.act));
    }
  }

  async start() {
    try {
      this.info = await api.get("/v1/studio/info");
    } catch (e) {
      if (e instanceof api.Unauthorized) return this.locked(api.key.get() ? "That key was refused." : "");
      return this.failed(e);
    }
    this.unlocked();
  }

  async login() {
    const k = $("login-key").value.trim();
    if (!k) return;
    api.key.set(k);
    $("login-key").value = "";
    await this.start();
  }

  // No data on screen, no polling, until a key the server accepts is given.
  locked(message) {
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
    this.info = null;
    this.drawn = null;
    for (const id of ["tree", "messages", "models", "store"]) $(id).replaceChildren();
    $("app").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message;
    $("login-key").focus();
  }

  unlocked() {
    $("login").hidden = true;
    $("app").hidden = false;
    $("lock").hidden = !api.key.get();
    $("server-version").textContent = `ctx-engine ${this.info.version}`;
    $("kv-chip").textContent = `KV ${this.info.kv}`;
    const select = $("model");
    const chosen = select.value || this.info.default_model;
    select.replaceChildren(...this.info.models.map((m) => new Option(m, m, false, m === chosen)));
    this.chat.render();
    this.showSettings();
    this.refresh();
    this.panels();
    this.tick();
    this.timers = [setInterval(() => this.tick(), 1000), setInterval(() => this.refresh(), 5000),
      setInterval(() => this.panels(), 10000)];
  }

  failed(e) {
    if (e instanceof api.Unauthorized) return this.locked("The server asks for the API key again.");
    toast(e.message || String(e), "error");
  }

  model() {
    return this.chat.current?.model || $("model").value || this.info?.default_model || "";
  }

  showSettings() {
    $("settings-line").textContent = `${this.model()} · KV ${this.info?.kv ?? "?"} · ${this.sampling.describe()}`;
    $("settings-line").title = "what the next message is sent with";
  }

  // Names of the live contexts (a new context, fork or restore must not take one).
  names() {
    const out = new Set();
    const walk = (n) => {
      for (const i of n.items) if (i.kind === "context") out.add(i.name);
      n.children.forEach(walk);
    };
    for (const g of this.forest) walk(g.root);
    return out;
  }

  freeName(base) { return freeName(base, this.names()); }

  selectedKey() {
    const c = this.chat.current;
    return c ? (c.kind === "context" ? `context:${c.name}` : `snapshot:${c.ref}`) : null;
  }

  async refresh() {
    if (!this.info) return;
    try {
      const tree = await api.get("/v1/studio/tree");
      const leftOut = tree.n_refs_left_out ?? 0;
      const drawn = JSON.stringify([tree.models, leftOut, this.selectedKey()]);
      this.forest = tree.models;
      if (drawn !== this.drawn) {  // redraw only on change: keeps hover and keyboard focus
        this.drawn = drawn;
        renderTree($("tree"), this.forest, { selected: this.selectedKey(), leftOut,
          onOpen: (item) => this.open(item) });
      }
      await this.follow();
      $("conn").textContent = "connected";
      $("conn").className = "chip ok";
    } catch (e) {
      $("conn").textContent = "disconnected";
      $("conn").className = "chip bad";
      this.failed(e);
    }
  }

  // The open context changed elsewhere (another client, the API): show it as it is now.
  async follow() {
    const c = this.chat.current;
    if (c?.kind !== "context" || this.chat.abort) return;
    let found = null;
    const walk = (n) => { found ??= n.items.find((i) => i.kind === "context" && i.name === c.name); n.children.forEach(walk); };
    for (const g of this.forest) walk(g.root);
    if (!found) {
      toast(`'${c.name}' is gone (deleted elsewhere)`);
      this.chat.clear();
    } else if (found.n_tokens !== c.n_tokens) {
      await this.chat.openContext(c.name);
    }
  }

  async panels() {
    if (!this.info) return;
    try {
      renderModels($("models"), await api.get("/v1/studio/models"));
      renderStore($("store"), this.info.store ? await api.get("/v1/studio/store") : null);
      $("gc").hidden = !this.info.store;
    } catch (e) { this.failed(e); }
  }

  async tick() {
    if (!this.info) return;
    try { await this.plots.tick(); } catch (e) { if (e instanceof api.Unauthorized) this.failed(e); }
  }

  async open(item) {
    try {
      if (item.kind === "context") await this.chat.openContext(item.name);
      else await this.chat.openSnapshot(item);
      this.showSettings();
      await this.refresh();
    } catch (e) { this.failed(e); }
  }

  async action(act) {
    const c = this.chat.current;
    if (!c) return;
    try {
      if (c.kind === "context") await this.contextAction(act, c);
      else await this.snapshotAction(act, c);
    } catch (e) { this.failed(e); }
    this.refresh();
    this.panels();
  }

  async contextAction(act, c) {
    const path = `/v1/contexts/${api.enc(c.name)}`;
    if (act === "snapshot") {
      const ref = await ask({ title: "Snapshot", value: c.name, confirm: "Snapshot",
        message: "Into the store under this ref (only the pages the store lacks are written)." });
      if (!ref) return;
      const r = await api.post(`${path}/snapshot`, { ref });
      toast(`Snapshot ${r.snapshot_id.slice(0, 12)} as '${ref}': ${r.pages_sent} of ${r.n_pages} pages written`);
    } else if (act === "fork") {
      const name = await ask({ title: "Fork", value: this.freeName(`${c.name}-fork`), confirm: "Fork",
        message: "A copy-on-write branch of the whole context: O(pages), no KV copied." });
      if (!name) return;
      await api.post(`${path}/fork`, { name });
      await this.open({ kind: "context", name });
    } else if (act === "delete") {
      if (!await ask({ title: `Delete '${c.name}'?`, confirm: "Delete", danger: true,
        message: "The live context goes; snapshots of it stay in the store." })) return;
      await api.del(path);
      this.chat.clear();
    }
  }

  async snapshotAction(act, c) {
    if (act === "restore") {
      const name = await ask({ title: "Restore", value: this.freeName(c.ref), confirm: "Restore",
        message: `A live context from snapshot ${c.snapshot_id.slice(0, 12)}, on the model whose weights made it.` });
      if (!name) return;
      await api.post(`/v1/contexts/${api.enc(name)}/restore`, { ref: c.ref });
      toast(`Restored '${c.ref}' as '${name}'`);
      await this.open({ kind: "context", name });
    } else if (act === "export") {
      await api.download(`/v1/studio/refs/${api.enc(c.ref)}/export`, `${c.ref.replaceAll("/", "_")}.ctxsnap`);
      toast(`Exported '${c.ref}' (ctx import reads it)`);
    } else if (act === "delete") {
      if (!await ask({ title: `Delete ref '${c.ref}'?`, confirm: "Delete", danger: true,
        message: "The ref goes now; its pages go at the next garbage collection if nothing else names them." })) return;
      await api.del(`/v1/studio/refs/${api.enc(c.ref)}`);
      this.chat.clear();
    }
  }

  async gc() {
    try {
      const r = await api.post("/v1/studio/store/gc");
      toast(`Collected ${r.manifests_removed} snapshots and ${r.pages_removed} pages (${bytes(r.bytes_freed)}); ` +
        `kept ${r.manifests_kept} snapshots, ${r.pages_kept} pages`);
      this.panels();
    } catch (e) { this.failed(e); }
  }
}

new Studio().start();
