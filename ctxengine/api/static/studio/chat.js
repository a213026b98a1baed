// The centre: one open context (or snapshot) as messages, and the composer that
// streams a reply into it through /v1/chat/completions with its `context` field.
import * as api from "./api.js";
import { ask, h, toast } from "./ui.js";

export class Chat {
  constructor(app) {
    this.app = app;                  // main.js: sampling, info, refresh(), open(), names()
    this.list = document.getElementById("messages");
    this.title = document.getElementById("chat-title");
    this.sub = document.getElementById("chat-sub");
    this.prompt = document.getElementById("prompt");
    this.sendButton = document.getElementById("send");
    this.current = null;             // {kind: "context", name, model} | {kind: "snapshot", ref}
    this.messages = [];
    this.stats = new Map();          // "context:end" -> what a reply streamed here took
    this.abort = null;
    document.getElementById("composer").addEventListener("submit", (e) => { e.preventDefault(); this.submit(); });
    this.prompt.addEventListener("keydown", (e) => {
      // Enter sends; while a reply streams it waits (only the Stop button stops a reply)
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); if (!this.abort) this.submit(); }
    });
  }

  clear() {
    this.current = null;
    this.messages = [];
    this.render();
  }

  async openContext(name) {
    const m = await api.get(`/v1/studio/contexts/${api.enc(name)}/messages`);
    this.current = { kind: "context", name: m.name, model: m.model, n_tokens: m.n_tokens };
    this.messages = m.messages;
    this.render();
  }

  async openSnapshot(item) {
    const m = await api.get(`/v1/studio/refs/${api.enc(item.ref)}/messages`);
    this.current = { kind: "snapshot", ref: item.ref, snapshot_id: m.snapshot_id, model: m.model,
      n_tokens: m.n_tokens, created: m.created };
    this.messages = m.messages;
    this.render();
  }

  render() {
    const c = this.current;
    document.body.dataset.open = c ? c.kind : "none";
    if (!c) {
      this.title.textContent = "New conversation";
      this.sub.textContent = `Sending starts a new context on ${this.app.model()}.`;
    } else if (c.kind === "context") {
      this.title.textContent = c.name;
      this.sub.textContent = `${c.model} · ${c.n_tokens} tokens · live context`;
    } else {
      this.title.textContent = c.ref;
      this.sub.textContent = `${c.model} · ${c.n_tokens} tokens · snapshot ${c.snapshot_id.slice(0, 12)}`;
    }
    this.list.replaceChildren(...this.messages.map((m, i) => this.bubble(m, i)));
    if (!this.messages.length) {
      this.list.append(h("div", { class: "empty chat-empty" },
        h("p", { text: c ? "This context is empty." : "Start a conversation with a served model." }),
        h("p", { class: "muted small", text: "Replies stream in; every turn stays in a named context you can fork." })));
    }
    const last = this.messages.at(-1);
    document.getElementById("generate").hidden = !(c?.kind === "context" && last && last.role === "user");
    this.prompt.disabled = c?.kind === "snapshot";
    this.prompt.placeholder = c?.kind === "snapshot" ? "A snapshot is read-only: restore it to go on from here."
      : "Message…  (Enter sends, Shift+Enter for a new line)";
    this.sendButton.disabled = c?.kind === "snapshot" && !this.abort;
    this.list.scrollTop = this.list.scrollHeight;
  }

  bubble(m, i) {
    const c = this.current;
    const live = c?.kind === "context";
    const actions = live ? h("div", { class: "msg-actions" },
      h("button", { class: "small", "data-act": "branch", title: "A new context holding the conversation up to here",
        onclick: () => this.branch(m), text: "Branch here" }),
      i < this.messages.length - 1 ? h("button", { class: "small", "data-act": "rewind",
        title: "Drop every token after this message", onclick: () => this.rewind(m), text: "Rewind here" }) : null)
      : null;
    const stat = live ? this.stats.get(`${c.name}:${m.end}`) : null;
    return h("article", { class: `msg role-${m.role}`, "data-index": i, "data-role": m.role },
      h("header", {}, h("span", { class: "role", text: m.role }),
        h("span", { class: "tokens", text: m.end > m.start ? `${m.end - m.start} tok` : "" }), actions),
      h("div", { class: "body", text: m.text || "…" }),
      stat ? h("footer", { class: "stat", text: stat }) : null);
  }

  async submit() {
    if (this.abort) { this.abort.abort(); return; }
    const text = this.prompt.value.trim();
    if (!text || this.current?.kind === "snapshot") return;
    this.prompt.value = "";
    await this.stream(text);
  }

  // Stream a reply: to `text` as a new user turn, or (text null) to the turn already there.
  async stream(text) {
    try {
      if (!this.current) {
        const body = { model: this.app.model() };
        const system = document.getElementById("system").value.trim();
        if (system) body.system = system;
        const card = await api.post("/v1/contexts", body);
        this.current = { kind: "context", name: card.name, model: card.model, n_tokens: card.n_tokens };
        await this.openContext(card.name);
        this.app.refresh();
      }
      const { name, model } = this.current;
      if (text) this.list.append(this.bubble({ role: "user", text, start: 0, end: 0 }, -1));
      const reply = this.bubble({ role: "assistant", text: "", start: 0, end: 0 }, -1);
      reply.classList.add("streaming");
      this.list.querySelector(".chat-empty")?.remove();
      this.list.append(reply);
      const body = reply.querySelector(".body");
      body.textContent = "";
      this.setStreaming(true);
      const t0 = performance.now();
      let first = null;
      const result = await api.streamChat({
        model, context: name, messages: text ? [{ role: "user", content: text }] : [], ...this.app.sampling.params(),
      }, (delta) => {
        first ??= performance.now();
        body.textContent += delta;
        this.list.scrollTop = this.list.scrollHeight;
      }, this.abort.signal);
      const u = result.usage;
      if (u) {
        const secs = first ? (performance.now() - first) / 1000 : 0;
        const tps = secs > 0 && u.completion_tokens > 1 ? ` · ${((u.completion_tokens - 1) / secs).toFixed(1)} tok/s` : "";
        const ttft = first ? ` · first token ${Math.round(first - t0)} ms` : "";
        const stat = `${u.completion_tokens} tokens${tps}${ttft} · ${result.finish_reason} · ` +
          `${u.prompt_tokens_details?.cached_tokens ?? 0} of ${u.prompt_tokens} prompt tokens cached · ` +
          `${this.app.sampling.describe()} · KV ${this.app.info.kv}`;
        await this.openContext(name);
        const last = this.messages.filter((m) => m.role !== "user").at(-1);
        if (last) this.stats.set(`${name}:${last.end}`, stat);
      } else {
        await this.openContext(name);
      }
    } catch (e) {
      if (e.name !== "AbortError") this.app.failed(e);
      if (this.current?.kind === "context") await this.openContext(this.current.name).catch(() => {});
    } finally {
      this.setStreaming(false);
      this.render();
      this.app.refresh();
      this.app.panels();
    }
  }

  setStreaming(on) {
    this.abort = on ? new AbortController() : null;
    this.sendButton.textContent = on ? "Stop" : "Send";
    this.sendButton.classList.toggle("stop", on);
    document.body.classList.toggle("streaming", on);
  }

  async branch(m) {
    const { name } = this.current;
    const branch = await ask({ title: "Branch here", message: `A new context with the first ${m.end} tokens of ` +
      `'${name}' (through message ${m.index + 1}); the KV pages are shared, not copied.`,
      value: this.app.freeName(`${name}-b${m.index + 1}`), confirm: "Branch" });
    if (!branch) return;
    try {
      const card = await api.post(`/v1/contexts/${api.enc(name)}/fork`, { name: branch });
      const drop = card.n_tokens - m.end;
      if (drop > 0) await api.post(`/v1/contexts/${api.enc(branch)}/rewind`, { n: drop });
      toast(`Branched '${branch}' from '${name}'`);
      await this.app.open({ kind: "context", name: branch });
    } catch (e) { this.app.failed(e); }
  }

  async rewind(m) {
    const { name, n_tokens } = this.current;
    const drop = n_tokens - m.end;
    const ok = await ask({ title: "Rewind", message: `Drop the last ${drop} tokens of '${name}' (everything ` +
      `after message ${m.index + 1})? Snapshots keep what they hold.`, confirm: "Rewind", danger: true });
    if (!ok) return;
    try {
      await api.post(`/v1/contexts/${api.enc(name)}/rewind`, { n: drop });
      await this.openContext(name);
      this.app.refresh();
    } catch (e) { this.app.failed(e); }
  }
}
