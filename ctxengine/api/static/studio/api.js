// Every call the studio makes: the public HTTP API of `ctx serve`, with the API
// key (kept in sessionStorage, so it goes when the tab does) as a Bearer token.

const KEY = "ctx-studio-key";

export class Unauthorized extends Error {}

export const key = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (k) => sessionStorage.setItem(KEY, k),
  clear: () => sessionStorage.removeItem(KEY),
};

function headers(extra = {}) {
  const h = { ...extra };
  const k = key.get();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

async function fail(r) {
  if (r.status === 401) throw new Unauthorized("a valid API key is required");
  let message = `${r.status} ${r.statusText}`;
  try {
    const body = await r.json();
    message = body?.error?.message || body?.error || message;
  } catch { /* not JSON: keep the status line */ }
  throw new Error(message);
}

export async function call(method, path, body) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  if (!r.ok) await fail(r);
  return r.json();
}

export const get = (path) => call("GET", path);
export const post = (path, body = {}) => call("POST", path, body);
export const del = (path) => call("DELETE", path);

export async function text(path) {
  const r = await fetch(path, { headers: headers() });
  if (!r.ok) await fail(r);
  return r.text();
}

export async function download(path, filename) {
  const r = await fetch(path, { headers: headers() });
  if (!r.ok) await fail(r);
  const url = URL.createObjectURL(await r.blob());
  const a = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// POST a streamed chat completion; onDelta(text) for each piece, resolves to the
// final usage and finish reason. Server-sent events are read off the body stream.
export async function streamChat(body, onDelta, signal) {
  const r = await fetch("/v1/chat/completions", {
    method: "POST", signal,
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  if (!r.ok) await fail(r);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  const result = { usage: null, finish_reason: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return result;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the generation failed");
        if (chunk.usage) result.usage = chunk.usage;
        const choice = chunk.choices?.[0];
        if (choice?.delta?.content) onDelta(choice.delta.content);
        if (choice?.finish_reason) result.finish_reason = choice.finish_reason;
      }
    }
  }
  return result;
}

export const enc = (name) => name.split("/").map(encodeURIComponent).join("/");
